"""The SGLang plugin entry point: ``[project.entry-points."sglang.srt.plugins"] spec_decode_profiler``.

SGLang's ``load_plugins()`` calls ``register()`` in every process it starts (launcher, scheduler, ...);
hooks are applied in the scheduler, which owns the EAGLE worker. Without ``SPEC_DECODE_PROFILE`` in the
environment nothing is registered, so installing the package changes nothing.
"""

from __future__ import annotations

import atexit
import logging
import os

log = logging.getLogger("spec_decode.profiler")
MODULE = "sglang.srt.speculative.eagle_worker_v2"
# (target, phase); phase None = the whole cycle
TARGETS = (
    (f"{MODULE}.EAGLEWorkerV2.forward_batch_generation", None),
    (f"{MODULE}.EagleDraftWorker.draft", "draft"),
    (f"{MODULE}.EAGLEWorkerV2.verify", "verify"),
    (f"{MODULE}.EagleDraftWorker._draft_extend_for_decode", "extend"),
)


def make_timer(path: str):
    from .timer import CudaClock, HostClock, PhaseTimer

    clock = HostClock()
    try:
        import torch

        if torch.cuda.is_available():
            clock = CudaClock(torch)
    except ImportError:
        pass
    every = int(os.environ.get("SPEC_DECODE_PROFILE_SUMMARY_EVERY", "200"))
    merge = os.environ.get("SPEC_DECODE_PROFILE_MERGE_US")
    return PhaseTimer(path, clock=clock, summary_every=every, merge_us=float(merge) if merge else None)


def register() -> None:
    path = os.environ.get("SPEC_DECODE_PROFILE")
    if not path:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    timer = make_timer(path)
    for target, phase in TARGETS:
        hook = timer.around_cycle if phase is None else timer.phase(phase)
        HookRegistry.register(target, hook, HookType.AROUND)
    atexit.register(timer.drain, True)
    log.info("spec_decode profiler: timing EAGLE-3 phases -> %s", path)
