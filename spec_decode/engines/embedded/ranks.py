"""The front's handle on the rank processes: start them, send them commands, copy their output into
the server log, and notice at once when one dies.

    group = RankGroup(spec)              # spawns spec.tp_size processes, waits until all are ready
    group.watch(on_death)                # from now on a rank's death calls on_death(err) once
    out = group.call("generate", ids, n, False)  # rank 0 takes it, every rank runs it, rank 0 answers
    out = group.call("generate", ids, n, True, on_chunk=f)  # streamed: f(new ids) per result first
    (calls from several threads at once are batched together by the ranks)
    group.close()                        # stop, join; SIGTERM/SIGKILL what does not stop

A rank that exits on its own makes ``call`` raise :class:`RankDied` (never a hang); its last output
lines are in the server log before the error is.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from dataclasses import replace

from spec_decode.core.gc_imports import frozen_imports
from spec_decode.engines.embedded.server_args import RankSpec
from spec_decode.engines.server_process import free_port

log = logging.getLogger("spec_decode.embedded")
TAIL_LINES = 20  # of each rank's output, kept for the error message when it dies


class RankDied(RuntimeError):
    """A rank process exited while the server was running; the message names it and its last lines."""


class RidInFlight(ValueError):
    """A call named a request id that a call still waiting holds (ids are the ranks' keys: SGLang's
    Req.rid). Raised by ``submit`` before anything is sent; the HTTP front answers it with a 400."""


def _rank_main(rank: int, spec: RankSpec, cmd_conn, log_conn) -> None:
    """What a spawned rank process runs: the scheduler's ``run_rank``. The front pickles this function,
    not ``run_rank``: pickling a function imports its module, and the scheduler's imports torch.

    Torch's import runs without the cyclic GC, and what it built is then frozen (``gc.freeze``: never
    scanned again): its ~170k objects made ~370 collections that freed almost nothing (~0.1 s of the
    rank's ~1.2 s of CPU to ready), and the exit's full collections scanned them again (~0.3 s more
    where the interpreter finalizes: ``close()``'s stop, a front gone). Only when the collector runs
    changes, never what a rank computes; the import's few cycles stay allocated (~1 MB)."""
    name_process(f"rank{rank}")
    with frozen_imports():  # lazy: torch loads in the rank processes only (the front never imports the scheduler)
        from spec_decode.engines.embedded.scheduler import run_rank

    run_rank(rank, spec, cmd_conn, log_conn)


def name_process(name: str) -> None:
    """The process's name as ``ps``, ``top`` and psutil show it (Linux: prctl PR_SET_NAME on the main
    thread, at most 15 bytes), as SGLang titles its scheduler and detokenizer processes: the runner's
    per-process CPU account (``runner.machine.tree_sample``) names a rank by it. Elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


class _OutputCopier(threading.Thread):
    """Copies one rank's output lines to our stdout (the server log) and keeps the last few."""

    def __init__(self, rank: int, conn):
        super().__init__(name=f"rank{rank}-output", daemon=True)
        self.conn = conn
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        fd, pending = self.conn.fileno(), b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._emit(line + b"\n")
        if pending:
            self._emit(pending + b"\n")
        self.conn.close()

    def _emit(self, line: bytes) -> None:
        self.tail.append(line.decode(errors="replace").rstrip("\n"))
        try:
            os.write(sys.stdout.fileno(), line)  # one write per line: lines never interleave
        except OSError:
            pass


class _Waiter:
    """One call waiting for rank 0's answer."""

    def __init__(self, on_chunk=None):
        self.on_chunk = on_chunk
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None

    def chunk(self, ids) -> None:
        if self.on_chunk is not None:
            self.on_chunk(ids)

    def set(self, result) -> None:
        self.result = result
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class RankGroup:
    def __init__(self, spec: RankSpec):
        self.spec = replace(spec, front_pid=os.getpid(), dist_port=spec.dist_port or free_port())
        self.lock = threading.Lock()  # guards the pipe to rank 0 and the waiting calls
        self.closing = False
        self.dead: RankDied | None = None
        self._deaths: dict[int, str] = {}  # rank -> how it died, said once (see _died)
        self._reaping = threading.Lock()
        ctx = multiprocessing.get_context("spawn")  # as SGLang: a fresh interpreter per rank
        self.procs, self.conns, self.copiers = [], [], []
        for rank in range(self.spec.tp_size):
            ours, theirs = ctx.Pipe()
            out_r, out_w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank_main, args=(rank, self.spec, theirs, out_w), name=f"rank{rank}")
            p.start()
            theirs.close()
            out_w.close()  # only the rank holds the write end: EOF when it dies
            copier = _OutputCopier(rank, out_r)
            copier.start()
            self.procs.append(p)
            self.conns.append(ours)
            self.copiers.append(copier)
        try:
            self.ready = [self._receive(rank)[1] for rank in range(self.spec.tp_size)]  # their payloads
        except BaseException:
            self.kill()
            raise
        self.pids = [p.pid for p in self.procs]
        self.waiters: dict[str, _Waiter] = {}
        self.next_rid = 0
        threading.Thread(target=self._dispatch, name="rank0-answers", daemon=True).start()

    def watch(self, on_death) -> None:
        """Call ``on_death(err)`` (from a thread) when a rank exits other than through close()."""
        threading.Thread(target=self._monitor, args=(on_death,), name="rank-monitor", daemon=True).start()

    # ---- commands ------------------------------------------------------------------------------------
    def call(self, cmd: str, *args, on_chunk=None, rid: str | None = None):
        """Send ``cmd`` to rank 0 (which broadcasts it to the others between two cycles) and wait for
        its answer; any number of calls may wait at once (the ranks batch the requests). Rank 0's
        ``("chunk", rid, ids)`` messages before the answer (a streamed generate) go to ``on_chunk``; a
        step's answers come as one ``("batch", None, [...])`` message, taken in its order."""
        return self.submit(cmd, *args, on_chunk=on_chunk, rid=rid).wait()

    def submit(self, cmd: str, *args, on_chunk=None, rid: str | None = None) -> _Waiter:
        """``call`` without the wait: the command is sent, its answer comes from the returned waiter's
        ``wait()``. ``rid``: the request's id in the ranks (the request's own, as SGLang's Req.rid); the
        one check that it is not in flight already (RidInFlight), under the lock that registers it."""
        waiter = _Waiter(on_chunk)
        with self.lock:
            if self.dead is not None:
                raise self.dead
            if rid is None:
                self.next_rid += 1
                rid = f"{self.next_rid:x}"
            elif rid in self.waiters:
                raise RidInFlight(f"rid {rid!r}: a request with this id is still running; send a new rid")
            self.waiters[rid] = waiter
            try:
                self.conns[0].send((cmd, rid, *args))
            except OSError:
                pass  # a dead rank 0: the dispatcher fails this call
        return waiter

    def _dispatch(self) -> None:
        """Rank 0's messages to their callers; on a rank's death every waiting call raises RankDied."""
        conn = self.conns[0]
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while True:
            ready = multiprocessing.connection.wait([conn, *sentinels])
            if conn in ready:
                try:
                    tag, rid, payload = conn.recv()
                except (EOFError, OSError):
                    tag = None  # it died mid-message: its sentinel says so next
                if tag is not None:
                    for tag_, rid_, payload_ in payload if tag == "batch" else [(tag, rid, payload)]:
                        self._answer(tag_, rid_, payload_)
                    continue
            dead = [sentinels[s] for s in ready if s in sentinels]
            if dead:
                err = self._died(dead[0])
                with self.lock:
                    self.dead = self.dead or err
                    waiters, self.waiters = list(self.waiters.values()), {}
                for waiter in waiters:
                    waiter.fail(self.dead)
                return

    def _answer(self, tag: str, rid: str, payload) -> None:
        """One of rank 0's answers to its caller: a streamed request's chunk, or the final answer."""
        waiter = self.waiters.get(rid)
        if waiter is None:
            return
        if tag == "chunk":
            waiter.chunk(payload)
        else:
            with self.lock:
                self.waiters.pop(rid, None)
            waiter.set(payload)

    def _receive(self, rank: int):
        """The next message from ``rank`` (start-up only), or RankDied as soon as any rank has exited."""
        conn = self.conns[rank]
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while True:
            ready = multiprocessing.connection.wait([conn, *sentinels])
            if conn in ready:
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    pass  # it died mid-message: its sentinel says so next
            for s in ready:
                if s in sentinels:
                    raise self._died(sentinels[s])

    # ---- failure ---------------------------------------------------------------------------------
    def _died(self, rank: int) -> RankDied:
        """How ``rank`` died, with its last log lines. The dispatcher and the monitor both ask at
        once: two threads joining one process race in multiprocessing (one reaps it, the other's
        waitpid gets ECHILD and reads exit code None), so one thread reaps and the answer is kept."""
        with self._reaping:
            if rank not in self._deaths:
                p, copier = self.procs[rank], self.copiers[rank]
                p.join(timeout=1)
                copier.join(timeout=1)  # its last lines reach the log before our error does
                code = p.exitcode
                how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
                tail = "\n".join(f"    {line}" for line in copier.tail) or "    (no output)"
                self._deaths[rank] = f"rank {rank} (pid {p.pid}) died ({how}); its last log lines:\n{tail}"
            return RankDied(self._deaths[rank])

    def _monitor(self, on_death) -> None:
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        ready = multiprocessing.connection.wait(list(sentinels))
        if self.closing:
            return
        err = self._died(sentinels[ready[0]])
        self.dead = err
        log.error("%s", err)
        on_death(err)

    # ---- shutdown --------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the ranks cleanly (their atexit handlers run: the profiler drains), then force."""
        self.closing = True
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self, grace_s: float = 1.0) -> None:
        """SIGTERM every rank still alive (SIGCONT first: a stopped one cannot act on it), then SIGKILL."""
        self.closing = True
        alive = [p for p in self.procs if p.is_alive()]
        for p in alive:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for p in alive:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in alive:
            if p.is_alive():
                p.kill()
                p.join(timeout=grace_s)
