"""Concurrent pairing with real servers: both arms generate at the same time, each server's whole
process tree (front and rank) pinned to its own core, the cores swapped every pair; a job records
which pairing produced its CI."""

import functools
import json
import os

import psutil
import pytest

from spec_decode.runner import pairing
from spec_decode.runner.client import Client

from ..conftest import run_py
from .engine_args import embedded_server

pytestmark = pytest.mark.integration
needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="concurrent pairing needs 2 cores")


def thread_cores(pid: int) -> dict[int, set[int]]:
    """{thread id: cores} of every thread of every process of the tree, read back through psutil."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    assert len(procs) >= 2, "the embedded server is a front plus a rank process"
    out = {}
    for p in procs:
        for t in p.threads():
            out[t.id] = set(psutil.Process(t.id).cpu_affinity())
    return out


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    servers = []
    try:
        for name in ("a", "b"):
            servers.append(embedded_server(d / f"{name}.log", "--cpu-threads", "1").start())
        yield servers
    finally:
        for srv in servers:
            srv.stop()


@needs_two_cores
def test_concurrent_pairs_overlap_and_pin_each_tree_to_its_own_core(two_servers):
    a, b = two_servers
    ca, cb = Client(a.base_url, 60), Client(b.base_url, 60)
    body = ca.generate_body("The old robot sleeps in the garden. ", 64, 0.0, True)
    cores = pairing.usable_cores()[:2]
    p = pairing.Pairer(pairing.CONCURRENT, a.pid, b.pid, cores=cores)
    first, second = {cores[0]}, {cores[1]}
    # pinned from the start (the warmup runs where pair 0 will): every thread of each tree
    assert set(map(frozenset, thread_cores(a.pid).values())) == {frozenset(first)}
    assert set(map(frozenset, thread_cores(b.pid).values())) == {frozenset(second)}
    overlaps, shorters = [], []
    for i in range(3):
        ra, rb, info = p.run(i, functools.partial(ca.generate, body, 0, i), functools.partial(cb.generate, body, 0, i))
        want_a, want_b = (first, second) if i % 2 == 0 else (second, first)  # swapped every pair
        assert all(c == want_a for c in thread_cores(a.pid).values()), i
        assert all(c == want_b for c in thread_cores(b.pid).values()), i
        assert info["cores"] == {"spec": sorted(want_a), "base": sorted(want_b)}
        # both in flight together (one after the other: 0). Per pair a quarter of the shorter request at
        # least, over the three pairs most of it: the midpoints are aligned from estimated durations, and on
        # a loaded CI host one 0.12 s pair overlapped for 0.044 s (0.37) while the others stayed near 1.
        shorter = min(ra.wall_s, rb.wall_s)
        assert info["overlap_s"] == pytest.approx(pairing.overlap_s(ra, rb))
        assert pairing.overlap_s(ra, rb) > 0.25 * shorter, (ra, rb)
        overlaps.append(pairing.overlap_s(ra, rb))
        shorters.append(shorter)
        assert ra.completion_tokens == rb.completion_tokens == 64
    assert sum(overlaps) > 0.5 * sum(shorters), (overlaps, shorters)


def test_midpoints_align_and_interleaved_order_alternates():
    assert pairing.centered_delays({"spec": 1.0, "base": 3.0}) == {"spec": 1.0, "base": 0.0}
    assert pairing.centered_delays({"spec": 2.5, "base": 0.5}) == {"spec": 0.0, "base": 1.0}
    calls: list[str] = []

    def arm(name):
        def call():
            calls.append(name)
            return _Rec()

        return call

    p = pairing.Pairer(pairing.INTERLEAVED, os.getpid(), os.getpid())
    for i in range(3):
        _, _, info = p.run(i, arm("spec"), arm("base"))
        assert info["order"] == (["base", "spec"] if i % 2 == 0 else ["spec", "base"])
    assert calls == ["base", "spec", "spec", "base", "base", "spec"]
    with pytest.raises(ValueError, match="pairing 'abba': must be one of interleaved, concurrent"):
        pairing.Pairer("abba", 1, 1)
    with pytest.raises(ValueError, match="needs 2 CPU cores"):
        pairing.Pairer(pairing.CONCURRENT, os.getpid(), os.getpid(), cores=[0])


class _Rec:
    wall_s = 1.0


@needs_two_cores
def test_job_records_the_pairing_that_produced_its_ci(tmp_path):
    """A real job with benchmark.pairing=concurrent: its record says so next to the CI, per pair the
    cores each server was pinned to (read back) and how long both ran together."""
    out = tmp_path / "job"
    run_py(
        [
            "benchmark.runs=3",
            "benchmark.max_new_tokens=160",
            "benchmark.warmup=1",
            "tracking=off",
            "benchmark.pairing=concurrent",
            "benchmark.profile=false",  # the timed pairs are the point; the profiled pass runs after them
            f"hydra.run.dir={out}",
        ]
    )
    rec = json.loads((out / "results.json").read_text())
    assert rec["status"] == "FINISHED"
    assert rec["speedup_vs_baseline"]["method"] == "paired"
    assert rec["speedup_vs_baseline"]["pairing"] == "concurrent"
    launch = rec["launches"][0]
    assert launch["pairing"] == "concurrent" and len(launch["pairs"]) == 3
    shares = []
    for i, (info, s, b) in enumerate(zip(launch["pairs"], rec["runs"], rec["baseline_runs"])):
        assert info["pair"] == i
        spec_cores, base_cores = info["cores"]["spec"], info["cores"]["base"]
        assert len(spec_cores) == len(base_cores) == 1 and spec_cores != base_cores
        both = min(s["end_wall"], b["end_wall"]) - max(s["start_wall"], b["start_wall"])
        assert both > 0, f"pair {i} ran one arm after the other"
        shares.append(both / min(s["wall_s"], b["wall_s"]))
    # the shorter run is (nearly) all inside the longer one; a slow outlier may shift one pair
    assert sorted(shares)[1] > 0.5, shares
    assert launch["pairs"][0]["cores"]["spec"] == launch["pairs"][1]["cores"]["base"]
    # the summary line names it too
    assert "3 concurrent pairs" in (out / "run.log").read_text()


def test_interleaved_job_with_server_nice_records_order_and_the_nice_read_back(tmp_path):
    """benchmark.server_nice reaches both servers' scheduler autogroups (read back from /proc by the
    job); the default pairing is interleaved and the record says so."""
    if not pairing.autogroups_enabled():
        pytest.skip("no scheduler autogroups here")
    out = tmp_path / "job"
    run_py(
        [
            "benchmark.runs=2",
            "benchmark.max_new_tokens=32",
            "benchmark.warmup=1",
            "tracking=off",
            "benchmark.server_nice=3",
            "benchmark.profile=false",  # the nice and the timed pairs' order are the point
            f"hydra.run.dir={out}",
        ]
    )
    rec = json.loads((out / "results.json").read_text())
    assert rec["status"] == "FINISHED" and rec["speedup_vs_baseline"]["pairing"] == "interleaved"
    launch = rec["launches"][0]
    assert launch["server_nice"] == 3 and launch["baseline_server_nice"] == 3
    assert [p["order"] for p in launch["pairs"]] == [["base", "spec"], ["spec", "base"]]
    s, b = rec["runs"], rec["baseline_runs"]
    assert b[0]["end_wall"] <= s[0]["start_wall"] and s[1]["end_wall"] <= b[1]["start_wall"]


@needs_two_cores
def test_server_cpus_pins_every_thread_of_both_servers(tmp_path):
    """benchmark.server_cpus: each server's whole tree (front, rank, their threads) on the given core, read
    back from the kernel per launch (the union over the tree's threads: one thread left out reads wider)."""
    core = max(os.sched_getaffinity(0))
    out = tmp_path / "job"
    run_py(
        [
            "benchmark.runs=2",
            "benchmark.max_new_tokens=16",
            "benchmark.warmup=1",
            "benchmark.profile=false",
            "tracking=off",
            f"benchmark.server_cpus={core}",
            f"hydra.run.dir={out}",
        ]
    )
    rec = json.loads((out / "results.json").read_text())
    assert rec["status"] == "FINISHED" and len(rec["launches"]) == 1
    for launch in rec["launches"]:
        assert launch["server_cpus"] == [core] and launch["baseline_server_cpus"] == [core]
