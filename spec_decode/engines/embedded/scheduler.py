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
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from spec_decode.engines.embedded.decoding import Decoder, ForcedAcceptance
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.model import load_drafter, load_target, read_config
from spec_decode.engines.embedded.parallel import TensorParallel, shard_units
from spec_decode.engines.plugins import load_plugins

log = logging.getLogger("spec_decode.embedded")

PR_SET_PDEATHSIG = 1
FRONT_GONE_EXIT = 3  # exit code of a rank whose front disappeared


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to start (picklable: it travels to the spawned processes)."""

    model_path: str
    draft_model_path: str | None
    steps: int
    tp_size: int
    device: str
    cpu_threads: int
    random_seed: int | None
    decode_log_interval: int
    log_level: str
    dist_port: int
    front_pid: int
    disable_cuda_graph: bool = False  # on CUDA: run the static shapes eagerly (SGLang's flag)


class Counters:
    """Speculative counters since the last /flush_cache, and the decode-log window."""

    def __init__(self) -> None:
        self.reset()
        self.last_log_tic = time.monotonic()  # like SGLang: not reset while idle

    def reset(self) -> None:
        self.total_accept_tokens = 0
        self.total_verify_ct = 0
        self.window_tokens = 0
        self.window_forward_ct = 0
        self.window_correct = 0
        self.last_gen_throughput = 0.0

    def snapshot(self) -> dict:
        """What /server_info reports: ``internal_states[0]``."""
        avg = self.total_accept_tokens / self.total_verify_ct if self.total_verify_ct else None
        # Lifetime since the last /flush_cache, like SGLang's; never a run's number.
        return {"last_gen_throughput": self.last_gen_throughput, "avg_spec_accept_length": avg}


class Scheduler:
    """The decoding side of one rank: the Decoder, and on rank 0 the counters and decode log.

    A streamed request (``stream=True``): rank 0 sends ``("chunk", [new token ids])`` to the front
    after the prefill and after every decode step / verify cycle but the finishing one, whose tokens
    come with the final ``("ok", ...)``.
    A send is a small pipe write that the front drains at once (never the HTTP client's pace)."""

    def __init__(self, decoder, rank: int, decode_log_interval: int, conn=None):
        self.decoder = decoder
        self.rank = rank
        self.interval = max(1, decode_log_interval)
        self.counters = Counters()
        self.kv_tokens = 0
        self.conn = conn  # rank 0's pipe to the front (stream chunks)

    def generate(self, ids: list[int], n: int, stream: bool = False) -> dict:
        on_tokens = self._streamer(n) if stream and self.rank == 0 and self.conn is not None else None
        gen = self.decoder.generate(ids, n, on_step=self._on_step if self.rank == 0 else None,
                                    on_tokens=on_tokens)
        self.kv_tokens = 0
        return {"generation": asdict(gen), "internal_state": self.counters.snapshot()}

    def _streamer(self, n: int):
        sent = 0

        def on_tokens(new) -> None:
            nonlocal sent
            ids = new.tolist()
            if sent + len(ids) >= n:
                return  # the finishing step: its tokens travel in the final answer (SGLang's last event)
            sent += len(ids)
            self.conn.send(("chunk", ids))

        return on_tokens

    def flush(self) -> dict:
        self.counters.reset()
        return {"internal_state": self.counters.snapshot()}

    def _on_step(self, tokens: int, accepted: int | None) -> None:
        c = self.counters
        c.window_tokens += tokens
        c.window_forward_ct += 1
        self.kv_tokens += tokens
        if accepted is not None:
            c.window_correct += accepted
            c.total_accept_tokens += tokens
            c.total_verify_ct += 1
        if c.window_forward_ct >= self.interval:
            self._log_decode()

    def _log_decode(self) -> None:
        c = self.counters
        now = time.monotonic()
        c.last_gen_throughput = c.window_tokens / max(now - c.last_log_tic, 1e-9)
        dec = self.decoder
        parts = ["#running-req: 1", f"#token: {self.kv_tokens}",
                 f"token usage: {self.kv_tokens / dec.context:.2f}"]
        if dec.drafter is not None:
            parts.append(f"accept len: {c.window_tokens / c.window_forward_ct:.2f}")
            parts.append(f"accept rate: {c.window_correct / (c.window_forward_ct * dec.steps):.2f}")
        graph = "cuda graph" if dec.device.type == "cuda" else "cpu graph"
        parts += [f"{graph}: {dec.cuda_graph}", f"gen throughput (token/s): {c.last_gen_throughput:.2f}",
                  "#queue-req: 0"]
        log.info("Decode batch, " + ", ".join(parts))
        c.window_tokens = c.window_forward_ct = c.window_correct = 0
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
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=f"[%(asctime)s{tag}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        stream=sys.stdout, force=True)


def _init_distributed(rank: int, spec: RankSpec):
    """Join the group (tp > 1) and pick the device; returns the torch device."""
    device = torch.device("cpu")
    if spec.device == "cuda":
        visible = torch.cuda.device_count()
        if rank >= visible:
            raise SystemExit(f"error: --tp-size {spec.tp_size} --device cuda: rank {rank} needs cuda:{rank} "
                             f"but {visible} GPU(s) are visible (CUDA_VISIBLE_DEVICES="
                             f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    if spec.tp_size > 1:
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{spec.dist_port}", rank=rank, world_size=spec.tp_size,
            # A peer that dies ends a gloo collective at once (its socket closes); this bounds
            # only a peer that hangs, and the front kills the group long before.
            timeout=timedelta(minutes=10), **kwargs,
        )
    return device


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
    runner = None
    if device.type == "cuda":  # static buffers; CUDA graphs captured now unless disabled
        runner = StaticRunner(target, drafter, spec.steps, use_graphs=not spec.disable_cuda_graph)
    forced = ForcedAcceptance.from_env(spec.steps, spec.random_seed or 0) if drafter is not None else None
    if forced is not None and rank == 0:
        log.warning("%s", forced.describe())
    decoder = Decoder(target, drafter, spec.steps, runner, forced)
    # Warm the kernels once so the first request does not pay for lazy initialisation (through the
    # hooks, as SGLang's warmup request is: its cycles are in the profile before any request).
    decoder.generate([32] * 8, 8)
    if forced is not None:  # the requests' draws start from the seed, whatever the warmup drew
        forced.generator.manual_seed(spec.random_seed or 0)
    scheduler = Scheduler(decoder, rank, spec.decode_log_interval, cmd_conn if rank == 0 else None)
    cmd_conn.send(("ready", {"rank": rank, "pid": os.getpid(), "plugins": plugins}))
    _serve_commands(scheduler, cmd_conn, rank)


def _serve_commands(scheduler: Scheduler, conn, rank: int) -> None:
    """Run the front's commands until ``stop``. An exception ends the process (nonzero): the group
    may be mid-collective, so the front stops the whole server, as SGLang does."""
    while True:
        try:
            cmd, *args = conn.recv()
        except EOFError:  # the front is gone: exit through atexit, so the profiler drains
            sys.exit(FRONT_GONE_EXIT)
        if cmd == "stop":
            break
        if cmd == "generate":
            out = scheduler.generate(*args)
        elif cmd == "flush":
            out = scheduler.flush()
        else:
            raise ValueError(f"unknown command {cmd!r}")
        if rank == 0:
            conn.send(("ok", out))
    if dist.is_initialized():
        dist.destroy_process_group()
    log.info("rank %d stopped", rank)
