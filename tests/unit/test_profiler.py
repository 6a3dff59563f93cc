"""The profiler plugin's process rules and the timer's resolution order (no process of its own here;
the live multi-rank path is tested through real engine servers in tests/integration/test_profile_ranks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spec_decode.parsers import profile
from spec_decode.profiler.timer import PhaseTimer

pytestmark = pytest.mark.unit


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)


REGISTER = r"""
import sys, threading, types
class Poison(types.ModuleType):
    def __getattr__(self, name):
        raise AssertionError(f"register() touched torch.{name}")
sys.modules["torch"] = Poison("torch")  # any use of torch (CUDA included) fails loudly
from spec_decode.engines.plugins import registry
from spec_decode.profiler import plugin
plugin.register()
reg = registry()[0]
print("HOOKS", sum(len(v) for v in reg._hooks.values()), "THREADS", threading.active_count())
"""


def test_register_without_the_env_var_registers_nothing(tmp_path):
    p = _run(REGISTER, {"SPEC_DECODE_PROFILE": ""})
    assert p.returncode == 0, p.stderr
    assert "HOOKS 0 THREADS 1" in p.stdout


def test_register_only_registers_no_torch_no_thread_no_file(tmp_path):
    path = tmp_path / "profile.jsonl"
    p = _run(REGISTER, {"SPEC_DECODE_PROFILE": str(path)})
    assert p.returncode == 0, p.stderr
    assert "HOOKS 4 THREADS 1" in p.stdout  # four AROUND hooks, nothing started
    assert list(tmp_path.iterdir()) == []


class Mark:
    """A device event stand-in: complete only when the test says so."""

    def __init__(self, clock):
        self.clock, self.done, self.at = clock, False, clock.now

    def query(self):
        return self.done


class StepClock:
    """A clock whose marks complete when the test completes them (like CUDA events on a busy GPU)."""

    def __init__(self):
        self.now, self.marks, self.waits = 0.0, [], 0

    def mark(self):
        self.now += 1.0
        m = Mark(self)
        self.marks.append(m)
        return m

    def release(self, *marks):
        pass

    def ready(self, m):
        return m.done

    def wait(self, m):
        self.waits += 1
        m.done = True

    def ms(self, a, b):
        return b.at - a.at

    def to_host(self, v):
        return v


class Accepted:
    """Accepted counts that may be read only after the cycle's end event completed."""

    def __init__(self, end_ready):
        self.end_ready = end_ready

    def sum(self):
        assert self.end_ready(), "accepted counts read before the cycle's end event completed (a sync)"
        return 3


def test_timer_never_waits_or_reads_counts_before_events_complete(tmp_path):
    clock = StepClock()
    timer = PhaseTimer(str(tmp_path / "p.rank0.jsonl"), clock=clock, flush_s=None, merge_us=0)

    class Result:
        pass

    def cycle():
        timer.phase("verify")(lambda: None)  # AROUND: calls the original
        r = Result()
        end = len(clock.marks)  # the cycle's end event is the next mark
        r.accept_lens = Accepted(lambda: clock.marks[end].done)
        return r

    for _ in range(5):
        timer.around_cycle(cycle)
    assert timer.drain() == 0 and clock.waits == 0  # nothing complete: nothing written, no wait
    for m in clock.marks[:4]:  # the first cycle's marks complete
        m.done = True
    assert timer.drain() == 1
    assert timer.drain(wait=True) == 4 and clock.waits > 0  # shutdown may wait
    lines = [json.loads(x) for x in (tmp_path / "p.rank0.jsonl").read_text().splitlines()]
    assert [x["accepted"] for x in lines] == [3] * 5 and {x["rank"] for x in lines} == {0}


def test_rank_files_and_agreement(tmp_path):
    base = tmp_path / "profile.jsonl"
    assert profile.rank_path(base, 3).endswith("profile.rank3.jsonl")
    for rank, cycle_ms in ((0, 10.0), (1, 10.4)):
        with open(profile.rank_path(base, rank), "w") as f:
            for t in (1.0, 2.0, 3.0, 9.0):  # 9.0 is outside the timed window
                f.write(json.dumps({"t": t, "rank": rank, "draft_ms": 2, "verify_ms": 6, "extend_ms": 1,
                                    "cycle_ms": cycle_ms, "accepted": 3}) + "\n")
    summary, per_window = profile.summarize_run_windows(base, [(0.5, 3.5)])
    assert summary["cycles"] == 3 and summary["ranks"] == 2 and [len(w) for w in per_window] == [3]
    agree = summary["rank_agreement"]
    assert agree["ok"] and agree["ranks"]["1"]["cycle_ms_diff_pct"] == pytest.approx(4.0)
    # A rank with fewer cycles (a lost tail) disagrees.
    with open(profile.rank_path(base, 1), "a") as f:
        f.write(json.dumps({"t": 3.2, "rank": 1, "draft_ms": 2, "verify_ms": 6, "extend_ms": 1,
                            "cycle_ms": 10.4, "accepted": 3}) + "\n")
    summary, _ = profile.summarize_run_windows(base, [(0.5, 3.5)])
    assert not summary["rank_agreement"]["ok"]


DOUBLE_SIGTERM = r"""
import os, signal, sys, threading, time
from spec_decode.profiler import plugin
from spec_decode.profiler.timer import HostClock, PhaseTimer

class SlowClock(HostClock):
    def ms(self, a, b):
        time.sleep(0.01)  # a slow resolution: the second SIGTERM lands mid-drain
        return (b - a) * 1e3

prof = plugin.Profiler(sys.argv[1])
prof.timer = PhaseTimer(sys.argv[1], clock=SlowClock(), flush_s=None)
class R:
    accept_lens = [2]
def cycle():
    prof.timer.phase("verify")(lambda: None)
    return R()
for _ in range(60):
    prof.around_cycle(cycle)
plugin._chain_sigterm(prof.flush)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()  # as PDEATHSIG would
os.kill(os.getpid(), signal.SIGTERM)  # as the runner's kill of the tree
time.sleep(30)
"""


def test_two_sigterms_lose_no_cycle(tmp_path):
    """The runner's SIGTERM and the rank's parent-death SIGTERM arrive together: the tail is written
    once, whole, and the process then dies of SIGTERM."""
    path = tmp_path / "p.jsonl"
    p = subprocess.run([sys.executable, "-c", DOUBLE_SIGTERM, str(path)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == -15, p.stderr  # the default action ran after the drain
    lines = path.read_text().splitlines()
    assert len(lines) == 60 and len(set(lines)) == 60
