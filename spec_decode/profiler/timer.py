"""Per-cycle phase timing without breaking SGLang's overlap scheduler.

A cycle is one ``EAGLEWorkerV2.forward_batch_generation`` call that ran a verify (prefill calls are
dropped). Inside it, ``draft``, ``verify`` and ``extend`` are timed. On CUDA each boundary records an
event on the *current* stream (the scheduler's forward stream); events are resolved later, when
``query()`` says they completed -- never ``synchronize``/``elapsed_time`` inline. Without CUDA the host
clock is used. Each resolved cycle becomes one JSON line (DESIGN §3.4); every ``summary_every`` cycles a
human summary block goes to the server log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger("spec_decode.profiler")
PHASES = ("draft", "verify", "extend")


class HostClock:
    def mark(self):
        return time.perf_counter()

    def release(self, *marks) -> None:
        pass

    @staticmethod
    def ready(mark) -> bool:
        return True

    @staticmethod
    def wait(mark) -> None:
        pass

    @staticmethod
    def ms(a, b) -> float:
        return (b - a) * 1e3

    @staticmethod
    def to_host(value):
        return value


class CudaClock:
    """CUDA events from a pool (creating an event per mark costs a driver call each time).

    Built lazily, inside the rank process on its first hooked call -- after the engine has set the
    rank's device -- so no CUDA context is ever made by ``register()`` or in processes that never
    run a cycle (launcher, detokenizer)."""

    def __init__(self, torch):
        self.torch = torch
        self.device = torch.cuda.current_device()
        self._free: list = []
        self.launch_us = self._launch_cost_us()

    def _launch_cost_us(self) -> float:
        """Host time of one tiny kernel launch here: a host gap shorter than half of it cannot hold
        a launch, so two boundaries that close can share one event. Measured with events only
        (resolved once, at start, before any cycle): no synchronize of the device."""
        x = self.torch.zeros(1, device="cuda")
        for _ in range(5):
            x.add_(1)
        t0 = time.perf_counter()
        for _ in range(20):
            x.add_(1)
        return (time.perf_counter() - t0) / 20 * 1e6

    def mark(self):
        ev = self._free.pop() if self._free else self.torch.cuda.Event(enable_timing=True)
        ev.record(self.torch.cuda.current_stream())
        return ev

    def release(self, *events) -> None:
        self._free.extend(e for e in events if e is not None)

    @staticmethod
    def ready(mark) -> bool:
        return mark.query()

    @staticmethod
    def wait(mark) -> None:
        mark.synchronize()  # only at shutdown (drain(wait=True)), never inside a hook

    @staticmethod
    def ms(a, b) -> float:
        return 0.0 if a is b else a.elapsed_time(b)

    def to_host(self, value):
        """Start a copy of a device tensor into pinned host memory, ordered on the current stream;
        read it once the cycle's end event (recorded after this) has completed -- no sync now."""
        torch = self.torch
        if not (hasattr(value, "is_cuda") and value.is_cuda):
            return value
        host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=True)
        host.copy_(value, non_blocking=True)
        return host


@dataclass
class _Cycle:
    start: object
    end: object = None
    t: float = 0.0  # wall clock when the cycle's hook returned
    t0: float = 0.0  # wall clock when it was entered (t - t0: the cycle on the wall clock, no loop gap)
    phases: dict = field(default_factory=dict)  # name -> (start mark, end mark)
    accepted: object = None  # int, or a tensor resolved later
    last: object = None  # the latest boundary mark and when the host made it
    last_host: float = 0.0
    shared: int = 0
    released: bool = False  # its events went back to the pool
    rids: list | None = None  # the request ids in its batch, when the batch says


def batch_of(args: tuple, kwargs: dict):
    """The batch a hooked whole-cycle call got: SGLang's ``forward_batch_generation(self, batch, ...)``
    (eagle_worker_v2.py 1416), or the embedded engine's equivalent; None when no argument looks like
    one (read defensively: attribute presence only)."""
    batch = kwargs.get("batch")
    if batch is not None:
        return batch
    for a in args[:2]:
        if hasattr(a, "forward_mode") or hasattr(a, "reqs"):
            return a
    return None


def is_idle(batch) -> bool:
    """SGLang's IDLE batch (DP attention: a rank with no request of its own runs the decode path on
    an empty batch, eagle_worker_v2.py 1447-1463): no cycle of any request."""
    mode = getattr(batch, "forward_mode", None)
    idle = getattr(mode, "is_idle", None)
    return bool(idle()) if callable(idle) else False


def rids_of(batch) -> list | None:
    """``batch.reqs[i].rid`` for every request of the batch; None when the batch has no ``reqs``."""
    reqs = getattr(batch, "reqs", None)
    if reqs is None:
        return None
    try:
        return [getattr(r, "rid", None) for r in reqs]
    except TypeError:
        return None


class PhaseTimer:
    """Times the phases of each cycle in one rank process and appends one JSON line per cycle, with
    the rank, to this rank's own file (``path``). Resolved cycles are written by a flusher thread
    within ``flush_s`` of completing -- so a run's cycles are on disk once the server goes idle --
    and on SIGTERM/exit (the plugin's handler calls ``drain(wait=True)``)."""

    def __init__(
        self,
        path: str,
        clock=None,
        summary_every: int = 200,
        rank: int = 0,
        merge_us: float | None = None,
        flush_s: float | None = 0.05,
        max_pending: int = 1024,
        dp: int = 0,
        attn_dp: int = 0,
    ):
        self.path = path
        self.rank = rank  # the TP rank
        self.dp, self.attn_dp = dp, attn_dp
        self.in_flight = 0  # cycles entered and not yet recorded (SIGTERM waits for them)
        self._deferred: list = []
        self._flight_lock = threading.RLock()  # RLock: the SIGTERM handler may land while it is held
        self.clock = clock or HostClock()
        self.summary_every = summary_every  # 0: no summary block (ranks other than the logging one)
        self.max_pending = max_pending  # a safety cap: the hook drains itself only past this
        if merge_us is None:
            merge_us = 0.5 * getattr(self.clock, "launch_us", 0.0)
        self.merge_us = merge_us
        self._local = threading.local()
        self._pending: deque[_Cycle] = deque()
        self._lock = threading.RLock()  # RLock: the SIGTERM handler may interrupt a drain
        self._window: list[dict] = []
        self._stop = threading.Event()
        self._write_failed = False  # the flusher warns once when a write fails, then keeps retrying
        if flush_s:
            threading.Thread(
                target=self._flusher, args=(flush_s,), daemon=True, name="spec_decode-profile-flusher"
            ).start()

    def _flusher(self, every_s: float) -> None:
        device = getattr(self.clock, "device", None)
        if device is not None:  # query events in the rank's own device context, never GPU 0's
            self.clock.torch.cuda.set_device(device)
        while not self._stop.wait(every_s):
            if self._pending:
                try:
                    self.drain()
                except OSError as e:  # a full disk, a directory not there yet: the cycles stay pending
                    if not self._write_failed:
                        log.warning("profile %s: write failed (%s); cycles kept, retrying", self.path, e)
                    self._write_failed = True

    # ---- hooks (HookRegistry AROUND signature: fn(original_fn, *args, **kwargs)) -------------------
    def around_cycle(self, original, *args, **kwargs):
        batch = batch_of(args, kwargs)
        if batch is not None and is_idle(batch):
            return original(*args, **kwargs)
        with self._flight_lock:
            self.in_flight += 1
        try:
            t0 = time.time()
            cycle = _Cycle(start=self.clock.mark(), t0=t0)
            cycle.last, cycle.last_host = cycle.start, time.perf_counter()
            if batch is not None:
                cycle.rids = rids_of(batch)
            self._local.cycle = cycle
            try:
                result = original(*args, **kwargs)
            finally:
                self._local.cycle = None
            if "verify" in cycle.phases:  # a decode cycle (prefill batches have no verify)
                # The accepted counts travel to pinned host memory on the forward stream, before the
                # end event: they are read only once that event has completed.
                acc = getattr(result, "accept_lens", None)
                cycle.accepted = self.clock.to_host(acc)
                cycle.end = self._mark(cycle, force=cycle.accepted is not acc)
                cycle.t = time.time()
                with self._lock:
                    self._pending.append(cycle)
                    overflow = len(self._pending) > self.max_pending
                if overflow:
                    self.drain()
            return result
        finally:
            with self._flight_lock:
                self.in_flight -= 1
                run = self._deferred if self.in_flight == 0 else []
                if run:
                    self._deferred = []
            for fn in run:
                fn()

    def defer(self, fn) -> bool:
        """Run ``fn`` when no cycle is in flight any more; False (not queued) when none is now."""
        with self._flight_lock:
            if self.in_flight == 0:
                return False
            self._deferred.append(fn)
            return True

    def _mark(self, cycle: _Cycle, force: bool = False):
        """A boundary event; reuses the cycle's last one when the host spent under merge_us since
        (no kernel can have been launched in between), halving the event records per cycle."""
        now = time.perf_counter()
        if not force and cycle.last is not None and (now - cycle.last_host) * 1e6 < self.merge_us:
            cycle.shared += 1
            return cycle.last
        ev = self.clock.mark()
        cycle.last, cycle.last_host = ev, time.perf_counter()
        return ev

    def phase(self, name: str):
        def around(original, *args, **kwargs):
            cycle = getattr(self._local, "cycle", None)
            if cycle is None:
                return original(*args, **kwargs)
            a = self._mark(cycle)
            result = original(*args, **kwargs)
            cycle.phases[name] = (a, self._mark(cycle))
            return result

        around.__name__ = f"spec_decode_{name}_timer"
        return around

    # ---- resolution -------------------------------------------------------------------------------
    def drain(self, wait: bool = False) -> int:
        """Write every pending cycle whose events completed; with ``wait`` (shutdown only) wait for
        the rest."""
        with self._writing(), self._lock:
            lines = []
            for c in self._pending:
                if not self.clock.ready(c.end):
                    if not wait:
                        break
                    self.clock.wait(c.end)
                lines.append(self._resolve(c))
            if lines:
                # Written before they leave the queue: a drain interrupted here (SIGTERM's drain
                # runs in the same thread) writes them itself, so a dying rank loses nothing.
                with open(self.path, "a", encoding="utf-8") as f:
                    f.writelines(json.dumps(x) + "\n" for x in lines)
                for _ in lines:
                    self._pending.popleft()
            if self.summary_every:
                self._window.extend(lines)
                if len(self._window) >= self.summary_every:
                    log.info(summary_block(self._window))
                    self._window = []
        return len(lines)

    def close(self) -> None:
        with self._writing():
            self._stop.set()
            self.drain(wait=True)

    # ---- this thread's own write, and a signal handler that lands in it ---------------------------
    # SIGTERM's handler (plugin._chain_sigterm) runs on the main thread between two of its bytecodes,
    # which may be inside this timer's close() or drain(): a close at exit (atexit) that SIGTERM
    # interrupted inside ``Event.set`` deadlocked the nested close on the Event's lock, and the rank's
    # watchdog ended it with the run's last cycles unwritten (CI 2026-12-04). A nested drain between
    # a write and its popleft would write those lines twice. So the handler asks ``after_write``.
    @contextlib.contextmanager
    def _writing(self):
        local = self._local
        if not getattr(local, "writing", 0):
            local.writing, local.after = 0, []
        local.writing += 1
        try:
            yield
        finally:
            local.writing -= 1
            if local.writing == 0 and local.after:
                run, local.after = local.after, []
                for fn in run:
                    fn()

    def writing_here(self) -> bool:
        """Whether the calling thread is inside this timer's ``drain`` or ``close``."""
        return getattr(self._local, "writing", 0) > 0

    def after_write(self, fn) -> bool:
        """Run ``fn`` once the calling thread has left its ``drain``/``close``; False (not queued) when it
        is in neither."""
        if not self.writing_here():
            return False
        self._local.after.append(fn)
        return True

    def _resolve(self, c: _Cycle) -> dict:
        rec = {
            "t": round(c.t, 6),
            "t0": round(c.t0, 6),
            "rank": self.rank,
            "tp": self.rank,
            "dp": self.dp,
            "attn_dp": self.attn_dp,
        }
        if c.rids is not None:
            rec["rids"] = c.rids
        for p in PHASES:
            a, b = c.phases.get(p, (None, None))
            rec[f"{p}_ms"] = round(self.clock.ms(a, b), 4) if a is not None else 0.0
        rec["cycle_ms"] = round(self.clock.ms(c.start, c.end), 4)
        if not c.released:
            c.released = True
            marks = {id(m): m for m in (c.start, c.end, *(m for pair in c.phases.values() for m in pair))}
            self.clock.release(*marks.values())
        acc = c.accepted
        if acc is not None and hasattr(acc, "tolist"):  # a host tensor: its copy finished before the end event
            acc = acc.tolist()
        if isinstance(acc, (list, tuple)):  # one count per request of the batch, in batch order
            rec["accept_lens"] = [int(x) for x in acc]
            acc = sum(rec["accept_lens"])
        elif acc is not None and hasattr(acc, "sum"):
            acc = int(acc.sum())
        rec["accepted"] = acc  # the batch's committed tokens in this cycle
        return rec


def summary_block(cycles: list[dict]) -> str:
    """The source fork's profiler block: ms per cycle and % per phase, accept length, tok/s."""
    n = len(cycles)
    cycle = sum(c["cycle_ms"] for c in cycles) / n
    parts = {p: sum(c[f"{p}_ms"] for c in cycles) / n for p in PHASES}
    parts["other"] = cycle - sum(parts.values())
    names = {"draft": "draft", "verify": "target verify", "extend": "draft re-extend", "other": "other"}
    acc = [c["accepted"] for c in cycles if c.get("accepted") is not None]
    lines = [f"[spec_decode profiler] last {n} cycles: {cycle:.2f} ms/cycle"]
    for p, v in parts.items():
        lines.append(f"  {names[p]:<16} {v:7.2f} ms  {100 * v / cycle if cycle else 0:5.1f}%")
    if acc:
        al = sum(acc) / len(acc)
        lines.append(f"  accept len {al:.2f}  effective {al / (cycle / 1e3):.1f} tok/s (per request)")
    return "\n".join(lines)
