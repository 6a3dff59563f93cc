"""The profiler plugin's entry point: ``[project.entry-points."sglang.srt.plugins"] spec_decode_profiler``.

Both engines call ``register()`` in every process they start: SGLang in its launcher, detokenizer
and each TP-rank scheduler (before the rank's device is set); our embedded engine in its front and
each rank (``spec_decode.engines.plugins.load_plugins``). So ``register()`` only registers: no CUDA, no file,
no thread. The timer is built on the first hooked call, inside the process that runs cycles, after the
engine has set its device; it writes that rank's own file (``profile.rank<N>.jsonl`` beside
``SPEC_DECODE_PROFILE``), and only the logging rank (0) prints summary blocks.

Without ``SPEC_DECODE_PROFILE`` in the environment nothing is registered: installing the package
changes nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading

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


def current_engine() -> str:
    """The engine this process belongs to: ours imports its package before loading plugins."""
    return "embedded" if "spec_decode.engines.embedded" in sys.modules else "sglang"


def current_rank(worker=None) -> int:
    """The TP rank of this process: SGLang's worker knows it; else torch.distributed; else 0."""
    rank = getattr(worker, "tp_rank", None)
    if isinstance(rank, int):
        return rank
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def make_timer(path: str, rank: int = 0):
    """The timer for this process; CUDA events when this process already uses CUDA."""
    from spec_decode.parsers.profile import rank_path
    from spec_decode.profiler.timer import CudaClock, HostClock, PhaseTimer

    clock = HostClock()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        clock = CudaClock(torch)
    every = int(os.environ.get("SPEC_DECODE_PROFILE_SUMMARY_EVERY", "200"))
    merge = os.environ.get("SPEC_DECODE_PROFILE_MERGE_US")
    # Seconds between the flusher's passes; 0 turns it off (then only SIGTERM/exit write the tail).
    flush_s = float(os.environ.get("SPEC_DECODE_PROFILE_FLUSH_S", "0.05"))
    return PhaseTimer(rank_path(path, rank), clock=clock, rank=rank,
                      summary_every=every if rank == 0 else 0,
                      merge_us=float(merge) if merge else None, flush_s=flush_s or None)


class Profiler:
    """The hooks, with the timer made on first use in the process that runs cycles."""

    def __init__(self, path: str):
        self.path = path
        self.timer = None
        self._lock = threading.Lock()

    def _timer_for(self, args):
        if self.timer is None:
            with self._lock:
                if self.timer is None:
                    self.timer = make_timer(self.path, current_rank(args[0] if args else None))
                    log.info("spec_decode profiler: rank %d timing phases -> %s", self.timer.rank,
                             self.timer.path)
        return self.timer

    def around_cycle(self, original, *args, **kwargs):
        return self._timer_for(args).around_cycle(original, *args, **kwargs)

    def phase(self, name: str):
        def around(original, *args, **kwargs):
            timer = self.timer
            if timer is None:  # no cycle has started in this process
                return original(*args, **kwargs)
            return timer.phase(name)(original, *args, **kwargs)

        around.__name__ = f"spec_decode_{name}_timer"
        return around

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.close()


def _chain_sigterm(flush) -> None:
    """On SIGTERM: write what is pending, then do what the process would have done (its previous
    handler, or the default action: die by SIGTERM). SGLang's schedulers install no handler, so
    without this the buffered tail of the last run would be lost (atexit does not run)."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    flushing = threading.Event()

    def on_sigterm(signum, frame):
        # A second SIGTERM (the runner's kill of the tree, then PDEATHSIG when the front goes) may
        # arrive while this one drains: it must not start a nested drain and exit from inside it.
        if flushing.is_set():
            return
        flushing.set()
        try:
            flush()
        except Exception:  # noqa: BLE001 - dying anyway; never block the default action
            log.exception("spec_decode profiler: flush on SIGTERM failed")
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


def register() -> None:
    path = os.environ.get("SPEC_DECODE_PROFILE")
    if not path:
        return
    from spec_decode.engines.plugins import registry

    hook_registry, hook_type, _ = registry()
    prof = Profiler(path)
    for target, phase in TARGETS[current_engine()]:
        hook = prof.around_cycle if phase is None else prof.phase(phase)
        hook_registry.register(target, hook, hook_type.AROUND)
    atexit.register(prof.flush)
    _chain_sigterm(prof.flush)
