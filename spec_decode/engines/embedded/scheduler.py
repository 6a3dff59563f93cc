"""One tensor-parallel rank of the embedded engine (SGLang's scheduler process, one per TP rank).

A rank is a spawned process that joins the torch.distributed group (gloo on CPU, NCCL on CUDA with
rank r on cuda:r), loads the plugins, holds its shard of the target and a whole copy of the drafter,
and runs the commands the front sends over its pipe: every rank runs each ``generate`` in lockstep
(the all-reduces pair them up), rank 0 answers. Rank 0 alone keeps the speculative counters and
writes ``Decode batch`` lines (SGLang: attention-TP rank 0). Its stdout/stderr go to a pipe that the
front copies into the server log and keeps the tail of, for the error message if this rank dies.

The rank dies with its front: PR_SET_PDEATHSIG delivers SIGTERM when the front goes (the profiler
plugin's chaining handler drains, then the default action ends the process), and a watchdog thread
ends it outright if the front is gone and the main thread is stuck in a collective.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist

from spec_decode.engines.embedded.decoding import Decoder, ForcedAcceptance, generation
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.loop import BatchLoop
from spec_decode.engines.embedded.model import load_drafter, load_target, read_config
from spec_decode.engines.embedded.parallel import TensorParallel, shard_units
from spec_decode.engines.embedded.server_args import RankSpec  # also its old home here (benchmarks, tests)
from spec_decode.engines.plugins import load_plugins

log = logging.getLogger("spec_decode.embedded")

PR_SET_PDEATHSIG = 1
FRONT_GONE_EXIT = 3  # exit code of a rank whose front disappeared
IDLE_POLL_S = 0.5  # an idle rank 0 broadcasts an empty command list this often


class Counters:
    """Speculative counters since the last /flush_cache, and the decode-log window."""

    def __init__(self) -> None:
        self.reset()
        self.last_log_tic = time.monotonic()  # like SGLang: not reset while idle

    def reset(self) -> None:
        self.total_accept_tokens = 0
        self.total_verify_ct = 0
        self.window_tokens = 0
        self.window_forward_ct = 0  # decode batches
        self.window_verify_ct = 0  # requests' counted verifies (SGLang's spec_num_forward_ct)
        self.window_correct = 0
        self.last_gen_throughput = 0.0

    def snapshot(self) -> dict:
        """What /server_info reports: ``internal_states[0]``."""
        avg = self.total_accept_tokens / self.total_verify_ct if self.total_verify_ct else None
        # Lifetime since the last /flush_cache, like SGLang's; never a run's number.
        return {"last_gen_throughput": self.last_gen_throughput, "avg_spec_accept_length": avg}


class Scheduler:
    """The decoding side of one rank: the BatchLoop over the Decoder, and on rank 0 the counters, the
    decode log and the answers.

    Commands reach rank 0 only (``("generate", rid, ids, n, stream)``, ``("flush", rid)``,
    ``("stop",)``); between two steps rank 0 takes every command waiting on its pipe and broadcasts
    the list to the other ranks (SGLang's ``recv_requests`` + ``broadcast_pyobj``), so every rank
    admits the same requests before the same cycle and the ranks stay in lockstep. While idle, rank 0
    waits up to ``IDLE_POLL_S`` for a command, then broadcasts an empty list (a heartbeat: the other
    ranks never wait in a collective long enough to time out).

    Rank 0 answers with ``("chunk", rid, ids)`` for a streamed request after each result that does not
    finish it, and ``("ok", rid, answer)`` when it finishes (SGLang's last event carries the finishing
    tokens); a step's answers go to the front as one message, ``("batch", None, [answers in order])``
    (one alone as itself), as SGLang's scheduler sends a step's outputs in one ``BatchTokenIDOut``: at
    concurrency 32 one pickle and one pipe write a step instead of 32, on the rank's host thread and in the
    front's dispatcher. ``/flush_cache`` waits until no request is running or waiting, as SGLang's does."""

    def __init__(
        self,
        decoder,
        rank: int,
        decode_log_interval: int,
        conn=None,
        max_running: int = 16,
        overlap: bool = True,
        tp_size: int = 1,
        group=None,
    ):
        self.decoder = decoder
        self.rank = rank
        self.interval = max(1, decode_log_interval)
        self.counters = Counters()
        self.conn = conn  # rank 0's pipe to the front
        self.outbox: list[tuple] = []  # this step's answers, sent together by _flush_outbox
        self.tp_size, self.group = tp_size, group
        lead = rank == 0 and conn is not None
        self.loop = BatchLoop(
            decoder,
            max_running,
            overlap,
            on_chunk=self._chunk if lead else None,
            on_finish=self._finish if lead else None,
            on_decode=self._on_decode if rank == 0 else None,
        )
        self.flushes: list[str] = []

    # ---- commands --------------------------------------------------------------------------------
    def receive(self) -> list[tuple]:
        """This step's commands, the same list on every rank."""
        msgs: list[tuple] = []
        if self.rank == 0:
            try:
                if self.loop.busy or self.conn.poll(IDLE_POLL_S):
                    while self.conn.poll(0):
                        msgs.append(self.conn.recv())
            except EOFError:  # the front is gone: exit through atexit, so the profiler drains
                sys.exit(FRONT_GONE_EXIT)
        if self.tp_size > 1:
            box = [msgs]
            dist.broadcast_object_list(box, src=0, group=self.group)
            msgs = box[0]
        return msgs

    def serve(self) -> None:
        """Run commands and steps until ``stop``."""
        while True:
            for cmd, *args in self.receive():
                if cmd == "stop":
                    return
                if cmd == "generate":
                    rid, ids, n, *stream = args
                    self.loop.add(self.decoder.new_req(rid, ids, n, bool(stream and stream[0])))
                elif cmd == "flush":
                    self.flushes.append(args[0])
                else:
                    raise ValueError(f"unknown command {cmd!r}")
            if self.flushes and not self.loop.busy:
                self.counters.reset()
                for rid in self.flushes:
                    self._send("ok", rid, {"internal_state": self.counters.snapshot()})
                self.flushes.clear()
            if self.loop.busy:
                self.loop.step()
            self._flush_outbox()

    def generate(self, ids: list[int], n: int) -> dict:
        """One request through this rank's loop and counters, in process (benchmarks/gpu): its answer."""
        req = self.decoder.new_req("local", ids, n)
        self.loop.add(req)
        self.loop.run_until_idle()
        return {"generation": asdict(generation(req, self.decoder.steps)), "internal_state": self.counters.snapshot()}

    def _send(self, tag: str, rid: str, payload) -> None:
        if self.rank == 0 and self.conn is not None:
            self.outbox.append((tag, rid, payload))

    def _flush_outbox(self) -> None:
        """The step's answers to the front in one message (one alone as itself), in the order they came."""
        if self.outbox:
            out, self.outbox = self.outbox, []
            self.conn.send(out[0] if len(out) == 1 else ("batch", None, out))

    def _chunk(self, req, ids: list[int]) -> None:
        if req.stream:
            self._send("chunk", req.rid, ids)

    def _finish(self, req) -> None:
        gen = generation(req, self.decoder.steps)
        self._send("ok", req.rid, {"generation": asdict(gen), "internal_state": self.counters.snapshot()})

    # ---- counters and the decode log (rank 0) ----------------------------------------------------
    def _on_decode(self, batch, counted) -> None:
        c = self.counters
        c.window_forward_ct += 1  # decode batches (SGLang's forward_ct_decode)
        for _req, tokens, accepted in counted:
            c.window_tokens += tokens
            if accepted is not None:
                c.window_verify_ct += 1
                c.window_correct += accepted
                c.total_accept_tokens += tokens
                c.total_verify_ct += 1
        if c.window_forward_ct >= self.interval:
            self._log_decode(batch)

    def _log_decode(self, batch) -> None:
        c = self.counters
        now = time.monotonic()
        c.last_gen_throughput = c.window_tokens / max(now - c.last_log_tic, 1e-9)
        dec, loop = self.decoder, self.loop
        kv = sum(r.tcache.length for r in loop.running if r.tcache is not None)
        parts = [
            f"#running-req: {batch.batch_size()}",
            f"#token: {kv}",
            f"token usage: {kv / (dec.context * loop.max_running):.2f}",
        ]
        if dec.drafter is not None:
            verifies = max(c.window_verify_ct, 1)
            parts.append(f"accept len: {c.window_tokens / verifies:.2f}")
            parts.append(f"accept rate: {c.window_correct / (verifies * dec.steps):.2f}")
        graph = "cuda graph" if dec.device.type == "cuda" else "cpu graph"
        parts += [
            f"{graph}: {dec.replays_graphs(batch.batch_size())}",
            f"gen throughput (token/s): {c.last_gen_throughput:.2f}",
            f"#queue-req: {len(loop.waiting)}",
        ]
        log.info("Decode batch, " + ", ".join(parts))
        c.window_tokens = c.window_forward_ct = c.window_correct = c.window_verify_ct = 0
        c.last_log_tic = now


# --------------------------------------------------------------------------- the rank process


def _redirect_output(log_conn) -> None:
    """stdout and stderr (Python's and the C level's) into the front's pipe, line-buffered."""
    os.dup2(log_conn.fileno(), 1)
    os.dup2(log_conn.fileno(), 2)
    log_conn.close()
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def _die_with_front(front_pid: int) -> None:
    """SIGTERM when the front dies (Linux), and a watchdog for a main thread stuck in C code."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog alone
    if os.getppid() != front_pid:  # the front died before prctl took effect
        os._exit(FRONT_GONE_EXIT)

    def watch() -> None:
        gone_since = None
        while True:
            time.sleep(0.25)
            if os.getppid() == front_pid:
                continue
            gone_since = gone_since or time.monotonic()
            # The SIGTERM above normally ends us at once; this catches a main thread that cannot
            # run the signal handler (blocked in a collective whose peer is gone or stopped).
            if time.monotonic() - gone_since > 2.0:
                os._exit(FRONT_GONE_EXIT)

    threading.Thread(target=watch, name="front-watchdog", daemon=True).start()


def _setup_logging(rank: int, tp_size: int, level: str) -> None:
    tag = f" TP{rank}" if tp_size > 1 else ""  # SGLang's rank tag in the log prefix
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"[%(asctime)s{tag}] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
        force=True,
    )


def _init_distributed(rank: int, spec: RankSpec):
    """Join the group (tp > 1) and pick the device; returns the torch device."""
    device = torch.device("cpu")
    if spec.device == "cuda":
        visible = torch.cuda.device_count()
        if rank >= visible:
            raise SystemExit(
                f"error: --tp-size {spec.tp_size} --device cuda: rank {rank} needs cuda:{rank} "
                f"but {visible} GPU(s) are visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
            )
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    if spec.tp_size > 1:
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{spec.dist_port}",
            rank=rank,
            world_size=spec.tp_size,
            # A peer that dies ends a gloo collective at once (its socket closes); this bounds
            # only a peer that hangs, and the front kills the group long before.
            timeout=timedelta(minutes=10),
            **kwargs,
        )
    return device


def static_runner(spec: RankSpec, target, drafter, device) -> StaticRunner | None:
    """The rank's static path (request slots and buffers, one shape per batch-size bucket; CUDA graphs unless
    disabled, or on CPU), as the server's flags ask for it; None for the dynamic / packed eager path."""
    if not ((device.type == "cuda" and not spec.cuda_eager_batching) or spec.static_path):
        return None
    return StaticRunner(
        target,
        drafter,
        spec.steps,
        use_graphs=not spec.disable_cuda_graph,
        max_bs=min(spec.cuda_graph_max_bs or spec.max_running_requests, spec.max_running_requests),
        slots=spec.max_running_requests,
        compile=spec.torch_compile,
        proj_split=spec.proj_split,
    )


def run_rank(rank: int, spec: RankSpec, cmd_conn, log_conn) -> None:
    """Entry point of a spawned rank process."""
    _redirect_output(log_conn)
    _die_with_front(spec.front_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the front's; the front stops us
    _setup_logging(rank, spec.tp_size, spec.log_level)
    torch.set_num_threads(spec.cpu_threads)
    if spec.random_seed is not None:
        torch.manual_seed(spec.random_seed)
    device = _init_distributed(rank, spec)
    plugins = load_plugins()
    log.info("rank %d (pid %d, %s): plugins loaded: %s", rank, os.getpid(), device, plugins)

    cfg = read_config(spec.model_path)
    units = shard_units(cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"])
    tp = TensorParallel(size=spec.tp_size, rank=rank, units=units)
    target = load_target(spec.model_path, str(device), tp)
    drafter = load_drafter(spec.draft_model_path, target, str(device)) if spec.draft_model_path else None
    # The command broadcast needs a CPU group: gloo itself on CPU, a gloo group beside NCCL on CUDA.
    group = dist.new_group(backend="gloo") if spec.tp_size > 1 and device.type == "cuda" else None
    runner = static_runner(spec, target, drafter, device)
    if runner is not None:
        runner.agree_on_graphs(group)  # a capture that failed on any rank: every rank runs eagerly
    forced = ForcedAcceptance.from_env(spec.steps, spec.random_seed or 0) if drafter is not None else None
    if forced is not None and rank == 0:
        log.warning("%s", forced.describe())
    decoder = Decoder(target, drafter, spec.steps, runner, forced)
    # Warm the kernels once so the first request does not pay for lazy initialisation (through the
    # hooks, as SGLang's warmup request is: its cycles are in the profile before any request).
    decoder.generate([32] * 8, 8)
    if forced is not None:  # the requests' draws start from the seed, whatever the warmup drew
        forced.generator.manual_seed(spec.random_seed or 0)
    if runner is not None and rank == 0:
        log.info(
            "static path: %d request slots, batch-size buckets %s (%s); larger batches run eagerly",
            runner.n_slots,
            runner.sizes,
            "CUDA graphs" if runner.graph_bs else "eager",
        )
    scheduler = Scheduler(
        decoder,
        rank,
        spec.decode_log_interval,
        cmd_conn if rank == 0 else None,
        spec.max_running_requests,
        not spec.disable_overlap_schedule,
        spec.tp_size,
        group,
    )
    cmd_conn.send(
        (
            "ready",
            {
                "rank": rank,
                "pid": os.getpid(),
                "plugins": plugins,
                "cuda_graph": decoder.cuda_graph,
                "cuda_graph_bs": runner.graph_bs if runner is not None else [],
                "cuda_graph_error": runner.capture_error if runner is not None else None,
            },
        )
    )
    scheduler.serve()
    if dist.is_initialized():
        dist.destroy_process_group()
    log.info("rank %d stopped", rank)
