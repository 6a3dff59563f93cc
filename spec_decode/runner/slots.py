"""GPU-slot allocator: concurrent jobs on one node get disjoint GPUs; never two jobs on one GPU.

A pool of slots (GPU ids, or CPU slots on a CPU profile) is a small JSON file guarded by a file lock
in ``hardware.slots_dir`` (machine-wide, so two sweeps on one node share it too). A job takes
``hardware.tp_size`` GPUs (one CPU slot on CPU), waits while too few are free, and gives them back on
exit. Slots of processes that died are reclaimed, so a crashed job never leaks its GPUs.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
from filelock import FileLock


class SlotTimeout(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_suffix(".lock")):
        state = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
        yield state
        path.write_text(json.dumps(state))


@contextmanager
def allocate(
    pool_name: str, slots: list[str], need: int, slots_dir: Path, timeout_s: float = 24 * 3600, poll_s: float = 0.2
):
    """Yield the list of slot ids this process holds; release on exit (also on error/Ctrl-C)."""
    if need > len(slots):
        raise ValueError(f"need {need} slots but the pool {pool_name!r} has only {len(slots)}")
    path = Path(slots_dir) / f"{pool_name}.json"
    pid = os.getpid()
    deadline = time.monotonic() + timeout_s
    mine: list[str] = []
    while True:
        with _locked(path) as state:
            for slot, owner in list(state.items()):
                if slot not in slots or not _alive(int(owner)):
                    del state[slot]  # reclaim slots of dead jobs
            free = [s for s in slots if s not in state]
            if len(free) >= need:
                mine = free[:need]
                for s in mine:
                    state[s] = pid
        if mine:
            break
        if time.monotonic() > deadline:
            raise SlotTimeout(f"no {need} free slot(s) in {pool_name!r} after {timeout_s:.0f}s")
        time.sleep(poll_s)
    try:
        yield mine
    finally:
        with _locked(path) as state:
            for s in mine:
                if state.get(s) == pid:
                    del state[s]


def pool_for(hardware) -> tuple[str, list[str], int]:
    """(pool name, slot ids, slots this job needs) for a hardware profile."""
    if hardware.device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x for x in visible.split(",") if x] if visible else [str(i) for i in range(hardware.num_gpus)]
        return "gpu", ids, hardware.tp_size
    return "cpu", [f"cpu{i}" for i in range(max(1, hardware.parallel_jobs))], 1
