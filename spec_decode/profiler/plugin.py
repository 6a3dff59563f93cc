"""The profiler plugin's entry point: ``[project.entry-points."sglang.srt.plugins"] spec_decode_profiler``.

Both engines call ``register()`` in every process they start: SGLang in its launcher, detokenizer
and each TP-rank scheduler (before the rank's device is set); our embedded engine in its front and
each rank (``spec_decode.engines.plugins.load_plugins``). So ``register()`` only registers: no CUDA, no file,
no thread. The timer is built on the first recorded cycle, inside the process that runs cycles, after
the engine has set its device; it writes that rank's own file (``profile.dp<d>.tp<t>.jsonl`` beside
``SPEC_DECODE_PROFILE``; d, t from the engine's parallel state), and only the logging rank (dp 0, tp 0)
prints summary blocks.

With ``SPEC_DECODE_PROFILE_SWITCH`` (``spec_decode.profiler.switch``) the hooks stay dormant while the
switch is off: the runner keeps them off in the timed runs and turns them on for a profiled pass
after them. Without ``SPEC_DECODE_PROFILE`` in the environment nothing is registered: installing the
package changes nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading

from spec_decode.engines.plugins import EMBEDDED_PROCESS_MODULES
from spec_decode.profiler.switch import ENV as SWITCH_ENV
from spec_decode.profiler.switch import Switch

log = logging.getLogger("spec_decode.profiler")
SGLANG_MODULE = "sglang.srt.speculative.eagle_worker_v2"
EMBEDDED_DECODER = "spec_decode.engines.embedded.decoding.Decoder"
# (target, phase); phase None = the whole cycle. The embedded engine's Decoder has the same phases.
TARGETS = {
    "sglang": (
        (f"{SGLANG_MODULE}.EAGLEWorkerV2.forward_batch_generation", None),
        (f"{SGLANG_MODULE}.EagleDraftWorker.draft", "draft"),
        (f"{SGLANG_MODULE}.EAGLEWorkerV2.verify", "verify"),
        (f"{SGLANG_MODULE}.EagleDraftWorker._draft_extend_for_decode", "extend"),
    ),
    "embedded": (
        (f"{EMBEDDED_DECODER}.cycle", None),
        (f"{EMBEDDED_DECODER}.draft", "draft"),
        (f"{EMBEDDED_DECODER}.verify", "verify"),
        (f"{EMBEDDED_DECODER}.extend", "extend"),
    ),
}


# The embedded engine's processes are told by modules only they import before loading plugins
# (spec_decode.engines.plugins.EMBEDDED_PROCESS_MODULES). Not the package itself: loading this plugin
# imports spec_decode.engines, whose argv builders import spec_decode.engines.embedded.launch -- inside
# SGLang's processes too.


def current_engine() -> str:
    """The engine this process belongs to."""
    return "embedded" if any(m in sys.modules for m in EMBEDDED_PROCESS_MODULES) else "sglang"


def _sglang_parallel() -> dict | None:
    """(tp, dp, attn_dp) from SGLang's own parallel state, read inside the rank on its first recorded
    cycle (``sglang/srt/runtime_context.py`` 1285 ``get_parallel``; published per process by
    ``publish``, 1573-1594: ``dp_rank`` is None without a DP controller). Imported here, not at module
    top: this runs inside SGLang's scheduler, and ``register()`` must not import sglang (seconds) in
    processes that never run a cycle. None outside SGLang or before the ranks are published."""
    if "sglang.srt.runtime_context" not in sys.modules:
        return None
    from sglang.srt.runtime_context import get_parallel  # lazy: inside SGLang only (see above)

    par = get_parallel()
    out = {}
    for key, name in (("tp", "tp_rank"), ("dp", "dp_rank"), ("attn_dp", "attn_dp_rank")):
        try:
            value = getattr(par, name)
        except (AttributeError, RuntimeError, ValueError):  # not published in this process
            value = None
        out[key] = value if isinstance(value, int) else 0
    try:
        published = isinstance(par.tp_rank, int)
    except (AttributeError, RuntimeError, ValueError):
        published = False
    return out if published else None


# Where a process's ranks come from, per engine: SGLang publishes its parallel state; ours has none.
PARALLEL_STATE = {"sglang": _sglang_parallel, "embedded": lambda: None}


def current_ranks(worker=None) -> dict[str, int]:
    """This process's place: ``{"tp", "dp", "attn_dp"}``. SGLang: its parallel state (never the world
    rank, which has no DP term); the embedded engine: its rank is the TP rank, one replica (dp 0);
    else torch.distributed's rank as TP rank; else 0."""
    if (found := PARALLEL_STATE[current_engine()]()) is not None:
        return found
    rank = getattr(worker, "tp_rank", None)
    if not isinstance(rank, int):
        rank = 0
        torch = sys.modules.get("torch")
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
    return {"tp": rank, "dp": 0, "attn_dp": 0}


def current_rank(worker=None) -> int:
    """The TP rank of this process (``current_ranks``)."""
    return current_ranks(worker)["tp"]


def make_timer(path: str, rank: int | dict = 0):
    """The timer for this process; CUDA events when this process already uses CUDA. ``rank``: the TP
    rank, or ``current_ranks()``'s dict."""
    # lazy: inside SGLang's processes; only one that runs cycles builds a timer
    from spec_decode.parsers.profile import rank_path
    from spec_decode.profiler.timer import CudaClock, HostClock, PhaseTimer

    ranks = rank if isinstance(rank, dict) else {"tp": rank, "dp": 0, "attn_dp": 0}
    clock = HostClock()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        clock = CudaClock(torch)
    every = int(os.environ.get("SPEC_DECODE_PROFILE_SUMMARY_EVERY", "200"))
    merge = os.environ.get("SPEC_DECODE_PROFILE_MERGE_US")
    # Seconds between the flusher's passes; 0 turns it off (then only SIGTERM/exit write the tail).
    flush_s = float(os.environ.get("SPEC_DECODE_PROFILE_FLUSH_S", "0.05"))
    logging_rank = ranks["tp"] == 0 and ranks["dp"] == 0
    return PhaseTimer(
        rank_path(path, ranks["tp"], ranks["dp"]),
        clock=clock,
        rank=ranks["tp"],
        dp=ranks["dp"],
        attn_dp=ranks["attn_dp"],
        summary_every=every if logging_rank else 0,
        merge_us=float(merge) if merge else None,
        flush_s=flush_s or None,
    )


class Profiler:
    """The hooks, with the timer made on the first recorded cycle in the process that runs cycles.
    While the switch is off every hook calls straight through (one byte read per cycle)."""

    def __init__(self, path: str, switch_path: str | None = None):
        self.path = path
        self.switch_path = switch_path
        self.switch = None  # mapped on the first hooked call, inside the rank
        self.timer = None
        self._lock = threading.Lock()

    def _timer_for(self, args):
        if self.timer is None:
            with self._lock:
                if self.timer is None:
                    self.timer = make_timer(self.path, current_ranks(args[0] if args else None))
                    log.info(
                        "spec_decode profiler: dp %d tp %d timing phases -> %s",
                        self.timer.dp,
                        self.timer.rank,
                        self.timer.path,
                    )
        return self.timer

    def around_cycle(self, original, *args, **kwargs):
        switch = self.switch
        if switch is None:
            switch = self.switch = Switch(self.switch_path)
        if not switch.on():
            return original(*args, **kwargs)
        return self._timer_for(args).around_cycle(original, *args, **kwargs)

    def phase(self, name: str):
        def around(original, *args, **kwargs):
            timer = self.timer
            if timer is None:  # no cycle has been recorded in this process
                return original(*args, **kwargs)
            return timer.phase(name)(original, *args, **kwargs)

        around.__name__ = f"spec_decode_{name}_timer"
        return around

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.close()

    def in_cycle(self) -> bool:
        return self.timer is not None and self.timer.in_flight > 0

    def after_cycle(self, fn) -> None:
        """Run ``fn`` once the cycle in flight has been recorded (at once when none is)."""
        if self.timer is None or not self.timer.defer(fn):
            fn()

    def in_write(self) -> bool:
        """Whether the calling thread is inside the timer's own drain or close."""
        return self.timer is not None and self.timer.writing_here()

    def after_write(self, fn) -> bool:
        """Queue ``fn`` for when the calling thread leaves the timer's drain or close; False when it is in
        neither."""
        return self.timer is not None and self.timer.after_write(fn)


def _chain_sigterm(prof: Profiler, wait_cycle_s: float = 2.0) -> None:
    """On SIGTERM: write what is pending, then do what the process would have done (its previous
    handler, or the default action: die by SIGTERM). SGLang's schedulers install no handler, so
    without this the buffered tail of the last run would be lost (atexit does not run).

    A SIGTERM that lands inside a cycle (a rank still in its last cycle's re-extend, which has no
    collective, while rank 0 has already answered and the runner stops the server) waits for that
    cycle to be recorded, at most ``wait_cycle_s``: draining at once lost it (the CI flake
    "rank 1: 48 cycles, 49 verifies"). One that lands inside the profiler's own drain or close (the
    exit's flush: a rank whose front went away runs it at ``sys.exit`` and then gets the
    parent-death SIGTERM) waits for it to end: a nested close deadlocked there and the run's last
    cycles were lost (CI 2026-12-04, ``test_profile_histogram_equals_the_servers_counters_per_request``).
    The handler takes no lock that the code it interrupted may hold (a Lock's non-blocking acquire)."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    flushing = threading.Lock()
    done = threading.Lock()

    def finish(signum):
        if not done.acquire(blocking=False):
            return  # the cycle's end and the wait's timer both got here: once
        try:
            prof.flush()
        except Exception:  # noqa: BLE001 - dying anyway; never block the default action
            log.exception("spec_decode profiler: flush on SIGTERM failed")
        if previous == signal.SIG_IGN:
            return
        if threading.current_thread() is not threading.main_thread():
            # Only the main thread may touch signal handlers, and it may be stuck in a collective:
            # end the process as SIGTERM's default action would, with its status.
            os._exit(128 + signal.SIGTERM)
        if callable(previous):
            previous(signum, None)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_sigterm(signum, frame):
        # A second SIGTERM (e.g. the embedded engine's PDEATHSIG when its front goes; SGLang's
        # schedulers get SIGKILL as their parent-death signal instead, utils/common.py 3432-3437)
        # may arrive while this one drains: it must not start a nested drain and exit from inside it.
        if not flushing.acquire(blocking=False):
            return
        if prof.in_write() or prof.in_cycle():
            timer = threading.Timer(wait_cycle_s, finish, (signum,))
            timer.daemon = True
            timer.start()
        when_quiet(signum)

    def when_quiet(signum):
        """``finish`` once this thread is out of the timer's drain/close and no cycle is in flight."""
        if not prof.after_write(lambda: when_quiet(signum)):
            prof.after_cycle(lambda: finish(signum))

    signal.signal(signal.SIGTERM, on_sigterm)


def install_exit_flush(prof: Profiler, wait_cycle_s: float = 2.0) -> None:
    """The tail is written however the process ends: at exit (atexit) and on SIGTERM."""
    atexit.register(prof.flush)
    _chain_sigterm(prof, wait_cycle_s)


def register() -> None:
    path = os.environ.get("SPEC_DECODE_PROFILE")
    if not path:
        return
    from spec_decode.engines.plugins import (
        registry,  # lazy: inside SGLang, only with SPEC_DECODE_PROFILE set
    )

    hook_registry, hook_type, _ = registry()
    prof = Profiler(path, os.environ.get(SWITCH_ENV) or None)
    for target, phase in TARGETS[current_engine()]:
        hook = prof.around_cycle if phase is None else prof.phase(phase)
        hook_registry.register(target, hook, hook_type.AROUND)
    install_exit_flush(prof, float(os.environ.get("SPEC_DECODE_PROFILE_TERM_WAIT_S", "2")))
