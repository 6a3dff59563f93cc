"""How a paired baseline's timed runs are paired with the spec server's (benchmark.pairing).

Both servers are up side by side for the whole launch (job._one_launch); pair i is one timed run of
each, and the speedup is taken per pair (stats.paired_ratio). Two ways to pair them:

- ``interleaved``: one arm after the other, pair i baseline-first when i is even and spec-first when
  odd (an order effect cancels over the pairs). Cancels machine-speed changes slower than a pair
  (~2-4 s for 2 x 500 tokens here); on a shared VM whose speed moves by tens of % within seconds
  it does not.
- ``concurrent``: both arms generate at the same time, each server's whole process tree pinned to
  its own half of the job's CPU cores (sched_setaffinity on every thread, so the ranks and the
  HTTP front stay there), the halves swapped every pair (a faster core cancels like the order).
  The shorter arm starts later, by half the difference of the expected durations, so that both runs
  share their midpoint: a machine-wide slowdown during the pair hits both arms alike, and a linear
  drift cancels. Needs 2 x tp_size usable cores (preflight says so otherwise).

Measured against each other in one run: benchmarks/pairing.py; numbers in docs/paired-baseline.md
(on this shared 2-core VM concurrent was not tighter, and the arms running at once slowed each other
unequally, so interleaved is the default). ``set_group_nice`` gives the servers CPU weight against other
sessions' work (benchmark.server_nice).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from spec_decode.core.config import CONCURRENT, INTERLEAVED, PAIRINGS

if TYPE_CHECKING:
    from spec_decode.record.runs import RunRecord


SPEC, BASE = "spec", "base"


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity: taskset, SLURM's cpuset)."""
    return sorted(os.sched_getaffinity(0))


def describe_cores(cores: list[int]) -> str:
    """taskset's list of ``cores``: ``0-3,8``."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def core_halves(cores: list[int]) -> tuple[set[int], set[int]]:
    """Two disjoint, equal halves of ``cores`` (one per server)."""
    if len(cores) < 2:
        raise ValueError(f"concurrent pairing needs 2 CPU cores, got {cores}")
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half : 2 * half])


def tree_threads(pid: int) -> list[int]:
    """Thread ids of a process and all its descendants (a server's front and its rank processes)."""
    root = psutil.Process(pid)
    tids: list[int] = []
    for p in [root, *root.children(recursive=True)]:
        try:
            tids += [t.id for t in p.threads()]
        except psutil.Error:
            continue  # exited meanwhile
    return tids


def pin_tree(pid: int, cores: set[int]) -> None:
    """Pin every thread of the process tree to ``cores`` (threads started later inherit it)."""
    for tid in tree_threads(pid):
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended between listing and pinning


def tree_affinity(pid: int) -> list[int]:
    """The union of the cores the tree's threads may run on, read back from the kernel."""
    cores: set[int] = set()
    for tid in tree_threads(pid):
        try:
            cores |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
    return sorted(cores)


AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"


def autogroups_enabled() -> bool:
    try:
        with open(AUTOGROUP_SWITCH) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def set_group_nice(pid: int, nice: int) -> None:
    """The CPU weight of the server's scheduler autogroup (Linux, kernel.sched_autogroup_enabled):
    the server runs in its own session, so this weighs its whole tree against other sessions' work
    on the same cores (negative values need root / CAP_SYS_NICE). A process's own nice would not do:
    the scheduler first shares a core between autogroups, then within one."""
    with open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))


def group_nice(pid: int) -> int:
    """The nice of the process's autogroup, read back (``/autogroup-123 nice -10``)."""
    with open(f"/proc/{pid}/autogroup") as f:
        return int(f.read().split()[-1])


def centered_delays(expected_s: dict[str, float]) -> dict[str, float]:
    """Start delays that give every arm the longest arm's midpoint: (longest - own) / 2."""
    longest = max(expected_s.values())
    return {arm: max(0.0, (longest - s) / 2) for arm, s in expected_s.items()}


def overlap_s(a: RunRecord, b: RunRecord) -> float:
    """Seconds both requests were in flight (0 when they did not overlap)."""
    return max(0.0, min(a.end_wall, b.end_wall) - max(a.start_wall, b.start_wall))


@dataclass
class Pairer:
    """Runs pair after pair for one launch. ``spec_pid``/``base_pid``: the servers' root processes;
    ``expected_s``: each arm's expected request time (the warmup's; then the median of the warmup's
    and the pairs' so far, so that one slow request does not push the arms apart)."""

    pairing: str
    spec_pid: int
    base_pid: int
    cores: list[int] = field(default_factory=usable_cores)
    expected_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._seen: dict[str, list[float]] = {}
        if self.pairing not in PAIRINGS:
            raise ValueError(f"pairing {self.pairing!r}: must be one of {', '.join(PAIRINGS)}")
        if self.pairing == CONCURRENT:
            self.halves = core_halves(self.cores)
            self._pin(0)  # the warmup runs where pair 0 will

    def _pin(self, i: int) -> dict[str, list[int]]:
        first, second = self.halves
        spec_cores, base_cores = (first, second) if i % 2 == 0 else (second, first)
        pin_tree(self.spec_pid, spec_cores)
        pin_tree(self.base_pid, base_cores)
        return {SPEC: tree_affinity(self.spec_pid), BASE: tree_affinity(self.base_pid)}

    def run(
        self, i: int, spec: Callable[[], RunRecord], base: Callable[[], RunRecord]
    ) -> tuple[RunRecord, RunRecord, dict]:
        """Pair i: (spec record, baseline record, what was done: order or cores, delays, overlap)."""
        calls = {SPEC: spec, BASE: base}
        if self.pairing == INTERLEAVED:
            order = [BASE, SPEC] if i % 2 == 0 else [SPEC, BASE]
            out = {arm: calls[arm]() for arm in order}
            info: dict = {"pair": i, "order": order}
        else:
            affinity = self._pin(i)
            delays = centered_delays(self.expected_s) if len(self.expected_s) == 2 else {SPEC: 0.0, BASE: 0.0}
            out = _concurrently(calls, delays)
            info = {"pair": i, "cores": affinity, "delay_s": delays, "overlap_s": overlap_s(out[SPEC], out[BASE])}
        if not self._seen:
            self._seen = {arm: [s] for arm, s in self.expected_s.items()}
        for arm, r in out.items():
            self._seen.setdefault(arm, []).append(r.wall_s)
        self.expected_s = {arm: statistics.median(v) for arm, v in self._seen.items()}
        return out[SPEC], out[BASE], info


def _concurrently(calls: dict[str, Callable[[], RunRecord]], delays: dict[str, float]) -> dict[str, RunRecord]:
    """Run the calls in threads released together (each after its delay); re-raise the first error."""
    out: dict[str, RunRecord] = {}
    errors: list[BaseException] = []
    gate = threading.Barrier(len(calls))

    def one(arm: str) -> None:
        try:
            gate.wait()
            if delays.get(arm):
                time.sleep(delays[arm])
            out[arm] = calls[arm]()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors.append(e)

    # daemon: Ctrl-C / SIGTERM in the main thread must not wait for the requests (the servers are
    # killed by the caller, which ends them)
    threads = [threading.Thread(target=one, args=(arm,), name=f"pair-{arm}", daemon=True) for arm in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out
