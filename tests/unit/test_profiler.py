"""The profiler plugin's process rules and the timer's resolution order (no process of its own here;
the live multi-rank path is tested through real engine servers in tests/integration/test_profile_ranks.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spec_decode.parsers import profile
from spec_decode.profiler.timer import PhaseTimer

pytestmark = pytest.mark.unit


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


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


def test_an_embedded_process_registers_in_our_registry_without_trying_sglangs():
    """In our engine's processes (the front, a rank: their modules loaded first) our registry is the one:
    where sglang is installed without its runtime, trying its registry imported torch and more before
    failing, ~1.5 s of CPU in every profiled process."""
    code = (
        "import sys; import spec_decode.engines.embedded.server; "
        "from spec_decode.engines.plugins import registry; "
        "print('SOURCE', registry()[2], 'SGLANG', 'sglang' in sys.modules, 'TORCH', 'torch' in sys.modules)"
    )
    p = _run(code, {})
    assert p.returncode == 0, p.stderr
    assert "SOURCE spec_decode SGLANG False TORCH False" in p.stdout


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


def _timer_with_cycles(path, n: int, flush_s: float | None) -> PhaseTimer:
    """A host-clock timer that has recorded ``n`` one-phase cycles (2 drafts accepted each)."""
    timer = PhaseTimer(str(path), flush_s=flush_s)

    class Result:
        accept_lens = [2]

    def cycle():
        timer.phase("verify")(lambda: None)
        return Result()

    for _ in range(n):
        timer.around_cycle(cycle)
    return timer


def test_cycles_leave_the_queue_only_once_they_are_written(tmp_path):
    """A drain whose write fails (here: the profile's directory is not there yet; in a rank, a full disk
    or a signal between the write and the dequeue) keeps its cycles pending: the next drain writes every
    one of them, once. Dequeued before the write, they would be gone."""
    path = tmp_path / "later" / "p.jsonl"
    timer = _timer_with_cycles(path, 7, flush_s=None)
    with pytest.raises(OSError):
        timer.drain()
    path.parent.mkdir()
    assert timer.drain() == 7
    lines = path.read_text().splitlines()
    assert len(lines) == 7 and len(set(lines)) == 7


def test_the_flusher_outlives_a_failed_write_and_loses_no_cycle(tmp_path):
    """The background flusher of a rank: a write that fails (no directory yet) is retried on its next
    tick, so the flusher keeps running and every cycle is written once when the write works again."""
    path = tmp_path / "later" / "p.jsonl"
    timer = _timer_with_cycles(path, 5, flush_s=0.01)
    deadline = time.monotonic() + 10
    while not timer._write_failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert timer._write_failed  # the flusher tried and failed
    path.parent.mkdir()
    while (not path.exists() or len(path.read_text().splitlines()) < 5) and time.monotonic() < deadline:
        time.sleep(0.01)
    timer.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 5 and len(set(lines)) == 5


def _cycle_line(t: float, rank: int, cycle_ms: float) -> str:
    """One profile line: draft 2 + verify 6 + extend 1 ms of a ``cycle_ms`` cycle, 3 drafts accepted."""
    line = {"t": t, "rank": rank, "draft_ms": 2, "verify_ms": 6, "extend_ms": 1, "cycle_ms": cycle_ms, "accepted": 3}
    return json.dumps(line) + "\n"


def test_rank_files_and_agreement(tmp_path):
    base = tmp_path / "profile.jsonl"
    assert profile.rank_path(base, 3).endswith("profile.dp0.tp3.jsonl")
    for rank, cycle_ms in ((0, 10.0), (1, 10.4)):
        with open(profile.rank_path(base, rank), "w") as f:
            for t in (1.0, 2.0, 3.0, 9.0):  # 9.0 is outside the timed window
                f.write(_cycle_line(t, rank, cycle_ms))
    summary, per_window = profile.summarize_run_windows(base, [(0.5, 3.5)])
    assert summary["cycles"] == 3 and summary["ranks"] == 2 and [len(w) for w in per_window] == [3]
    agree = summary["rank_agreement"]
    assert agree["ok"] and agree["ranks"]["1"]["cycle_ms_diff_pct"] == pytest.approx(4.0)
    # A rank with fewer cycles (a lost tail) disagrees.
    with open(profile.rank_path(base, 1), "a") as f:
        f.write(_cycle_line(3.2, 1, 10.4))
    summary, _ = profile.summarize_run_windows(base, [(0.5, 3.5)])
    assert not summary["rank_agreement"]["ok"]


def test_a_rank_15pct_slow_with_equal_cycle_counts_disagrees(tmp_path):
    """Equal counts are not enough: a rank whose mean cycle is 15% above rank 0's (tolerance 10%) disagrees,
    one 9% above agrees."""
    base = tmp_path / "profile.jsonl"
    for rank, cycle_ms in ((0, 10.0), (1, 11.5), (2, 10.9)):
        with open(profile.rank_path(base, rank), "w") as f:
            for t in (1.0, 2.0, 3.0):
                f.write(_cycle_line(t, rank, cycle_ms))
    agree = profile.summarize_run_windows(base, [(0.5, 3.5)])[0]["rank_agreement"]
    assert agree["ok"] is False
    assert agree["ranks"]["1"]["cycle_ms_diff_pct"] == pytest.approx(15.0)
    assert agree["ranks"]["2"]["cycle_ms_diff_pct"] == pytest.approx(9.0)
    two = profile.rank_agreement(
        {
            0: {"cycles": 3, "cycle_ms": 10.0, **{f"{p}_ms": 1.0 for p in profile.PHASES}},
            2: {"cycles": 3, "cycle_ms": 10.9, **{f"{p}_ms": 1.0 for p in profile.PHASES}},
        }
    )
    assert two["ok"] is True


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
plugin._chain_sigterm(prof)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()  # as PDEATHSIG would
os.kill(os.getpid(), signal.SIGTERM)  # as the runner's kill of the tree
time.sleep(30)
"""


def test_two_sigterms_lose_no_cycle(tmp_path):
    """The runner's SIGTERM and the rank's parent-death SIGTERM arrive together: the tail is written
    once, whole, and the process then dies of SIGTERM."""
    path = tmp_path / "p.jsonl"
    p = subprocess.run([sys.executable, "-c", DOUBLE_SIGTERM, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == -15, p.stderr  # the default action ran after the drain
    lines = path.read_text().splitlines()
    assert len(lines) == 60 and len(set(lines)) == 60


DOUBLE_SIGTERM_PREVIOUS = DOUBLE_SIGTERM.replace(
    "plugin._chain_sigterm(prof)",
    "signal.signal(signal.SIGTERM, lambda signum, frame: print('PREVIOUS', flush=True))\nplugin._chain_sigterm(prof)",
).replace("time.sleep(30)", "time.sleep(2.0)\nprint('END', flush=True)")


def test_a_second_sigterm_mid_drain_starts_no_nested_drain(tmp_path):
    """A second SIGTERM while the first one drains (slow clock), with a previous handler that returns:
    the second is ignored -- the drain and the previous handler run once, every cycle written once.
    A nested drain would write the outer drain's lines again and run the previous handler twice."""
    path = tmp_path / "p.jsonl"
    p = subprocess.run(
        [sys.executable, "-c", DOUBLE_SIGTERM_PREVIOUS, str(path)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["PREVIOUS", "END"]
    lines = path.read_text().splitlines()
    assert len(lines) == 60 and len(set(lines)) == 60


SIGTERM_MID_CYCLE = r"""
import os, sys, time
from spec_decode.profiler import plugin
from spec_decode.profiler.timer import PhaseTimer

prof = plugin.Profiler(sys.argv[1])
prof.timer = PhaseTimer(sys.argv[1], flush_s=None)
plugin._chain_sigterm(prof)
class R:
    accept_lens = [2]
def extend():
    print("IN_EXTEND", flush=True)  # the runner's SIGTERM lands here: a rank still in its last cycle
    time.sleep(1.0)
def cycle(last):
    prof.timer.phase("verify")(lambda: None)
    if last:
        prof.timer.phase("extend")(extend)
    return R()
for i in range(5):
    prof.around_cycle(cycle, i == 4)
time.sleep(30)
"""


def test_sigterm_inside_a_cycle_waits_for_it_to_be_recorded(tmp_path):
    """The CI flake "rank 1: 48 cycles, 49 verifies": rank 0 answered and the runner stopped the server
    while rank 1 was still in its last cycle's re-extend; the handler drained at once and died, and
    that cycle was never recorded. Now the handler waits for the cycle in flight."""
    path = tmp_path / "p.jsonl"
    p = subprocess.Popen([sys.executable, "-c", SIGTERM_MID_CYCLE, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "IN_EXTEND"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -15  # the default action ran, after the cycle and the drain
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 5 and lines[-1]["extend_ms"] >= 900  # the last cycle, whole


PREVIOUS_HANDLER_ONCE = r"""
import os, signal, sys, time
from spec_decode.profiler import plugin
from spec_decode.profiler.timer import PhaseTimer

prof = plugin.Profiler(sys.argv[1])
prof.timer = PhaseTimer(sys.argv[1], flush_s=None)
signal.signal(signal.SIGTERM, lambda signum, frame: print("PREVIOUS", flush=True))  # e.g. the engine's own
plugin._chain_sigterm(prof, wait_cycle_s=4.0)  # margin: the cycle ends at ~0.5 s
class R:
    accept_lens = [2]
def extend():
    os.kill(os.getpid(), signal.SIGTERM)  # lands inside the cycle: the handler waits for its end
    time.sleep(0.5)
def cycle():
    prof.timer.phase("verify")(lambda: None)
    prof.timer.phase("extend")(extend)
    return R()
prof.around_cycle(cycle)
time.sleep(5.0)  # past the wait's timer (4 s): it must not run the previous handler again
print("END", flush=True)
"""


def test_the_previous_handler_runs_once_when_the_cycle_ends_before_the_wait(tmp_path):
    """The cycle's end and the wait's timer both reach the handler's finish: the drain and the previous
    handler run once (a second run from the timer's thread would end the process with status 143)."""
    path = tmp_path / "p.jsonl"
    p = subprocess.run(
        [sys.executable, "-c", PREVIOUS_HANDLER_ONCE, str(path)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["PREVIOUS", "END"]
    assert len(path.read_text().splitlines()) == 1  # the cycle in flight, recorded


SIGTERM_IN_THE_EXIT_FLUSH = r"""
import atexit, json, os, signal, sys, time
from spec_decode.profiler import plugin
from spec_decode.profiler.timer import PhaseTimer

class R:
    accept_lens = [2]
def cycle(prof):
    prof.timer.phase("verify")(lambda: None)
    return R()

def rank_at_exit(path, k):
    # A rank whose front went away: its cycles pending, sys.exit runs the exit's flush, and the
    # parent-death SIGTERM lands at the flush's k-th call.
    prof = plugin.Profiler(path)
    prof.timer = PhaseTimer(path, flush_s=None)
    for _ in range(6):
        prof.around_cycle(cycle, prof)
    atexit.register(sys.setprofile, None)  # atexit is LIFO: this runs after the flush
    plugin.install_exit_flush(prof)
    calls = [0]
    def land(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1
            if calls[0] == k:
                sys.setprofile(None)
                os.kill(os.getpid(), signal.SIGTERM)
    atexit.register(sys.setprofile, land)  # runs first: the count starts where the flush does
    sys.exit(3)

base, out = sys.argv[1], []
for k in range(1, 5000):
    path = f"{base}.{k}"
    pid = os.fork()
    if pid == 0:
        rank_at_exit(path, k)
    deadline, status = time.monotonic() + 10, None
    while status is None and time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        status = os.waitstatus_to_exitcode(st) if done else time.sleep(0.005)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = "hung"
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    out.append({"k": k, "status": status, "lines": len(lines), "unique": len(set(lines))})
    if status == 3:  # the flush ended before its k-th call: every point inside it was hit
        break
print(json.dumps(out))
"""


def test_a_sigterm_anywhere_in_the_exit_flush_loses_and_doubles_no_cycle(tmp_path):
    """The CI flake of 2026-12-04 (a histogram 5 cycles short): an embedded rank whose front went away
    runs the profile's flush at exit, and the parent-death SIGTERM landed inside it (in ``Event.set``);
    the handler's nested flush deadlocked and the watchdog ended the rank with the tail unwritten.
    Here the SIGTERM lands at every call of the exit flush in turn (a forked process each): each time
    the 6 cycles are written once, and the process then dies of the SIGTERM."""
    p = subprocess.run(
        [sys.executable, "-c", SIGTERM_IN_THE_EXIT_FLUSH, str(tmp_path / "p.jsonl")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stderr
    points = json.loads(p.stdout)
    assert len(points) > 20 and points[-1]["status"] == 3  # the whole flush was walked
    bad = [x for x in points[:-1] if (x["status"], x["lines"], x["unique"]) != (-signal.SIGTERM, 6, 6)]
    assert not bad, bad


class _Mode:
    def __init__(self, idle):
        self.idle = idle

    def is_idle(self):
        return self.idle


class _Req:
    def __init__(self, rid):
        self.rid = rid


class _Batch:
    """The fields of SGLang's ScheduleBatch the timer reads (schedule_batch.py): reqs[i].rid, forward_mode."""

    def __init__(self, rids, idle=False):
        self.reqs = [_Req(r) for r in rids]
        self.forward_mode = _Mode(idle)


def _worker_cycle(timer, batch):
    class R:
        accept_lens = [2] * len(batch.reqs)

    def forward_batch_generation(worker, batch):
        timer.phase("verify")(lambda: None)
        return R()

    return timer.around_cycle(forward_batch_generation, object(), batch)


def test_idle_batches_are_not_cycles_and_cycles_carry_their_rids(tmp_path):
    timer = PhaseTimer(str(tmp_path / "p.jsonl"), flush_s=None, dp=1, attn_dp=1)
    _worker_cycle(timer, _Batch(["a", "b"]))
    _worker_cycle(timer, _Batch([], idle=True))  # a DP-attention rank with no request of its own
    _worker_cycle(timer, _Batch(["b"]))
    timer.close()
    lines = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [x["rids"] for x in lines] == [["a", "b"], ["b"]]
    assert [x["accepted"] for x in lines] == [4, 2]
    assert {(x["tp"], x["dp"], x["attn_dp"]) for x in lines} == {(0, 1, 1)}


def test_the_switch_keeps_the_hooks_dormant_until_the_runner_turns_it_on(tmp_path):
    from spec_decode.profiler import plugin
    from spec_decode.profiler.switch import set_switch

    sw = tmp_path / "profile.jsonl.switch"
    set_switch(sw, False)
    prof = plugin.Profiler(str(tmp_path / "profile.jsonl"), str(sw))

    def cycle(worker, batch):
        prof.phase("verify")(lambda: None)
        return type("R", (), {"accept_lens": [3]})()

    for _ in range(3):
        prof.around_cycle(cycle, object(), _Batch(["x"]))
    assert prof.timer is None and prof.switch.driven  # dormant: no timer, no file, no thread
    set_switch(sw, True)  # another write to the file: the mapping sees it at the next cycle
    for _ in range(2):
        prof.around_cycle(cycle, object(), _Batch(["x"]))
    set_switch(sw, False)
    prof.around_cycle(cycle, object(), _Batch(["x"]))
    prof.flush()
    lines = (tmp_path / "profile.dp0.tp0.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert plugin.Switch(str(tmp_path / "missing")).on()  # no file: not driven, always on


def test_replicas_and_old_names(tmp_path):
    """Two DP replicas: their logging ranks' cycles (different requests) are the job's, each replica's
    other ranks are compared with its own tp 0; an old ``.rank<t>`` file reads as dp 0."""
    base = tmp_path / "profile.jsonl"

    def write(path, ts, cycle_ms):
        with open(path, "w") as f:
            for t in ts:
                f.write(
                    json.dumps(
                        {"t": t, "draft_ms": 2, "verify_ms": 6, "extend_ms": 1, "cycle_ms": cycle_ms, "accepted": 3}
                    )
                    + "\n"
                )

    write(tmp_path / "profile.rank0.jsonl", (1.0, 2.0), 10.0)  # old name: dp 0, tp 0
    write(profile.rank_path(base, 1, dp=0), (1.0, 2.0), 10.2)
    write(profile.rank_path(base, 0, dp=1), (1.5, 2.5, 2.6), 20.0)
    write(profile.rank_path(base, 1, dp=1), (1.5, 2.5), 20.0)  # lost one cycle
    assert sorted(profile.rank_files(base)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    summary, per_window = profile.summarize_run_windows(base, [(0.0, 3.0)])
    assert summary["cycles"] == 5 and summary["replicas"] == 2 and summary["ranks"] == 4
    assert [c["t"] for c in per_window[0]] == [1.0, 1.5, 2.0, 2.5, 2.6]
    agree = summary["rank_agreement"]
    assert set(agree["ranks"]) == {"dp0.tp1", "dp1.tp1"} and not agree["ok"]
    assert agree["ranks"]["dp1.tp1"]["cycles"] == 2


def test_profiler_effect_from_pairs():
    from spec_decode.analysis.profiler_effect import effect, metrics_of

    on, off = [90.0, 99.0, 90.0], [100.0, 110.0, 100.0]  # 10% slower in every pair
    e = effect(on, off, [100.0, 104.0])
    assert e["effect_pct"] == pytest.approx(-10.0) and e["pairs"] == 3
    assert e["ci95_lo_pct"] == pytest.approx(-10.0) and e["ci95_hi_pct"] == pytest.approx(-10.0)
    assert e["on_vs_timed_pct"] == pytest.approx(100 * (93.0 / 102.0 - 1))
    assert metrics_of(e)["profiler_effect_pct"] == pytest.approx(-10.0)
    assert effect([], [1.0], []) is None


def test_cycles_are_attributed_to_requests_and_the_in_flight_extra_kept_apart():
    """Overlap: request a (2 verifies) runs one extra cycle after result 2 finished it, beside b's cycles
    in the same batch; b's counts are whole. A wrong rule (every cycle counted) gives a 3 cycles."""
    cyc = [
        {"t": t, "rids": r, "cycle_ms": 1.0}
        for t, r in ((1, ["a"]), (2, ["a", "b"]), (3, ["a", "b"]), (4, ["b"]), (5, ["b"]))
    ]
    cyc.append({"t": 6, "cycle_ms": 1.0})  # an older line without rids: counted, numbered
    out = profile.attribute(cyc, {"a": 2, "b": 3})
    assert out["per_request"]["a"] == {"cycles": 3, "counted": 2, "extra": 1, "spec_verify_ct": 2}
    assert out["per_request"]["b"] == {"cycles": 4, "counted": 3, "extra": 1, "spec_verify_ct": 3}
    assert [c["t"] for c in out["extra"]] == [5] and out["extra_cycles"] == 1  # t=3: b counted it
    assert len(out["counted"]) == 5 and out["without_rids"] == 1 and out["matches_verify_ct"]


def test_the_job_profile_counts_only_the_cycles_its_requests_counted(tmp_path):
    """Two ranks, one request (rid r, 2 verifies) whose in-flight extra cycle ends inside its window:
    the summary has 2 cycles, 1 extra set apart, and the ranks still agree."""
    base = tmp_path / "profile.jsonl"
    for tp in (0, 1):
        with open(profile.rank_path(base, tp), "w") as f:
            for t in (1.0, 2.0, 3.0):
                f.write(
                    json.dumps(
                        {
                            "t": t,
                            "rids": ["r"],
                            "draft_ms": 2,
                            "verify_ms": 6,
                            "extend_ms": 1,
                            "cycle_ms": 10.0,
                            "accepted": 3,
                        }
                    )
                    + "\n"
                )
    summary, per_window = profile.summarize_run_windows(base, [(0.5, 3.5)], requests=[("r", 2)])
    assert summary["cycles"] == 2 and summary["extra_cycles"] == 1 and [len(w) for w in per_window] == [2]
    assert summary["rank_agreement"]["ok"] and summary["rank_agreement"]["ranks"]["1"]["cycles"] == 2
    plain, _ = profile.summarize_run_windows(base, [(0.5, 3.5)])  # without attribution: all three
    assert plain["cycles"] == 3 and plain["extra_cycles"] == 0


def test_a_lagging_ranks_last_cycle_stays_in_its_requests_window(tmp_path):
    """Rank 1 ends the request's last cycle 5 ms after the client got the response (it was still in its
    re-extend when rank 0 answered): it entered the cycle inside the window, so it counts there."""
    base = tmp_path / "profile.jsonl"
    for tp, lag in ((0, 0.0), (1, 0.005)):
        with open(profile.rank_path(base, tp), "w") as f:
            for t in (1.0, 1.01, 1.02):
                f.write(
                    json.dumps(
                        {
                            "t0": t,
                            "t": t + 0.008 + lag,
                            "draft_ms": 2,
                            "verify_ms": 6,
                            "extend_ms": 0,
                            "cycle_ms": 8.0 + 1e3 * lag,
                            "accepted": 3,
                        }
                    )
                    + "\n"
                )
    summary, _ = profile.summarize_run_windows(base, [(0.99, 1.030)])  # the response at 1.030
    agree = summary["rank_agreement"]
    assert summary["cycles"] == 3 and agree["ranks"]["1"]["cycles"] == 3


def test_a_line_written_twice_by_an_interrupted_drain_is_one_cycle(tmp_path):
    line = json.dumps(
        {"t": 1.5, "t0": 1.4, "cycle_ms": 100.0, "draft_ms": 1, "verify_ms": 1, "extend_ms": 1, "accepted": 2}
    )
    other = line.replace('"t": 1.5', '"t": 1.6')
    (tmp_path / "p.jsonl").write_text("\n".join([line, other, line, other]) + "\n")
    assert [c["t"] for c in profile.read_profile(tmp_path / "p.jsonl")] == [1.5, 1.6]


def test_accept_len_is_per_request_cycle_when_a_cycle_carries_a_batch():
    from spec_decode.parsers.profile import phase_summary

    line = {"draft_ms": 1.0, "verify_ms": 2.0, "extend_ms": 1.0, "cycle_ms": 5.0}
    batched = [
        {**line, "rids": ["a", "b"], "accept_lens": [3, 2], "accepted": 5},
        {**line, "rids": ["a", "b"], "accept_lens": [1, 4], "accepted": 5},
    ]
    s = phase_summary(batched)
    assert s["accept_len"] == 2.5 and s["batch_size_mean"] == 2.0  # 10 tokens over 4 request-cycles
    assert s["tok_s_from_profile"] == 1000.0  # the batch's tokens over its cycles' time
    single = [{**line, "accepted": 3}, {**line, "accepted": 2}]  # older lines: no accept_lens
    assert phase_summary(single)["accept_len"] == 2.5


def test_inside_sglang_the_plugin_hooks_sglangs_targets_even_after_importing_our_engines_package():
    """Loading the plugin imports spec_decode.engines (whose argv builders import embedded.launch): that
    must not make an SGLang process look like the embedded engine (its hooks would target our Decoder)."""
    code = (
        "import sys; from spec_decode.engines.plugins import registry; import spec_decode.engines.embedded.launch; "
        "from spec_decode.profiler import plugin; a = plugin.current_engine(); "
        "import spec_decode.engines.embedded.scheduler; print(a, plugin.current_engine())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["sglang", "embedded"]
