"""Each server process's CPU over the timed runs (runner.machine.tree_sample / tree_window, analysis.host.server_cpu):
read from real processes, summed per process name, said busiest first."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from spec_decode.analysis import host
from spec_decode.record.measured import HostWindow, Launch, ProcCpu
from spec_decode.record.runs import RunRecord
from spec_decode.runner import machine

# A server tree in miniature: the root starts a middle process, which starts a "burner" (a busy loop: a
# grandchild, as SGLang's schedulers are the launcher's) and an "idler"; on SIGUSR1 the root starts a "late"
# process that burns ~0.3 s of CPU, then sleeps. Each names itself as our ranks do (ranks.name_process).
TREE = r"""
import os, signal, subprocess, sys, time
from spec_decode.engines.embedded.ranks import name_process
role = sys.argv[1]
if role == "root":
    mid = subprocess.Popen([sys.executable, "-c", sys.argv[2], "middle", sys.argv[2]], stdout=subprocess.PIPE, text=True)
    first = mid.stdout.readline()
    def late(*_):
        subprocess.Popen([sys.executable, "-c", sys.argv[2], "late", sys.argv[2]])
    signal.signal(signal.SIGUSR1, late)
    print(first.strip(), flush=True)
    while True:
        time.sleep(0.05)
name_process(role)
if role == "middle":
    kids = [subprocess.Popen([sys.executable, "-c", sys.argv[2], r, sys.argv[2]]) for r in ("burner", "idler")]
    time.sleep(0.5)
    print("READY", flush=True)
    while True:
        time.sleep(0.05)
if role == "burner":
    while True:
        pass
if role == "late":
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    open(os.environ["LATE_DONE"], "w").close()  # its burn is in: the test may read the tree
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("LATE_DONE", str(tmp_path / "late_done"))
    root = subprocess.Popen([sys.executable, "-c", TREE, "root", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout.readline().strip() == "READY"
        yield root
    finally:
        procs = psutil.Process(root.pid).children(recursive=True)
        for p in [*procs, psutil.Process(root.pid)]:
            p.kill()
        psutil.wait_procs([*procs], timeout=5)
        root.wait(5)


def test_each_process_of_a_server_tree_and_its_cpu_over_the_window(tree, tmp_path):
    """Relative figures only (a loaded 2-core machine gives the burner what it gives it): the busy process
    reads busier than the idle ones by far, its share is its CPU seconds over the window, and a process born
    inside the window counts with all of its time."""
    a = machine.tree_sample(tree.pid)
    tree.send_signal(signal.SIGUSR1)
    done, t0 = tmp_path / "late_done", time.monotonic()
    while not done.exists() or time.monotonic() - t0 < 1.0:
        assert time.monotonic() - t0 < 60, "the late process did not finish its 0.3 s of CPU in 60 s"
        time.sleep(0.05)
    b = machine.tree_sample(tree.pid)
    procs = {p.name: p for p in machine.tree_window(a, b)}
    assert set(procs) == {"launcher", "middle", "burner", "idler", "late"}, procs
    assert procs["launcher"].pid == tree.pid and all(isinstance(p, ProcCpu) for p in procs.values())
    s = b["t"] - a["t"]
    burner = procs["burner"]
    assert burner.cpu_s == pytest.approx(burner.core_pct * s / 100, abs=0.01)
    assert burner.core_pct > 5 * max(procs["idler"].core_pct, procs["middle"].core_pct, 1.0)
    assert procs["late"].cpu_s >= 0.29  # its burn at least (and its interpreter's start)
    assert all(p.threads and p.threads >= 1 for p in procs.values())


def test_processes_are_matched_by_pid_and_start_time():
    """Gone by the end: not counted. A pid reused inside the window (another start time): the new process,
    all of its time, not its CPU less the old one's."""
    a = {"t": 0.0, "procs": {10: ("launcher", 1.0, 4, 900.0), 11: ("rank0", 5.0, 2, 901.0), 12: ("x", 1.0, 1, 902.0)}}
    b = {
        "t": 2.0,
        "procs": {
            10: ("launcher", 1.5, 4, 900.0),
            11: ("python", 5.2, 1, 1001.0),  # rank0's pid, reused by a process started in the window
        },
    }
    assert machine.tree_window(a, b) == [ProcCpu("launcher", 10, 0.5, 25.0, 4), ProcCpu("python", 11, 5.2, 260.0, 1)]
    assert machine.tree_sample(None)["procs"] == {} and machine.tree_sample(2**22 + 12345)["procs"] == {}


def run(launch: int, tokens: int) -> RunRecord:
    return RunRecord(launch, 0, 0.0, 1.0, 1.0, 10, tokens)


def window(s: float, server=None, baseline=None) -> HostWindow:
    w = HostWindow(s + 0.1, 1.0, 1.0)  # the host window holds the probes too: the reads' own window is s
    w.procs_s = s
    if server is not None:
        w.server_procs = server
    if baseline is not None:
        w.baseline_procs = baseline
    return w


def test_server_cpu_sums_per_process_name_over_the_launches():
    launches = [
        Launch(0, 1, 100, 1.0, host=window(2.0, [ProcCpu("launcher", 100, 0.5, 25.0), ProcCpu("rank0", 101, 1.8, 90.0)],
                                           [ProcCpu("sglang::scheduler_TP0", 200, 1.0, 50.0)])),
        Launch(1, 1, 102, 1.0, host=window(2.0, [ProcCpu("launcher", 102, 0.3, 15.0), ProcCpu("rank0", 103, 2.0, 100.0)])),
        Launch(2, 1, 104, 1.0, host=window(2.0)),  # recorded before the account: adds nothing
    ]  # fmt: skip
    runs = [run(0, 600), run(0, 400), run(1, 1000), run(2, 5000)]
    m = host.server_cpu(launches, runs, [run(0, 500), run(1, 700)])
    assert m["server_cpu_pct.launcher"] == pytest.approx(100 * 0.8 / 4) and m["server_cpu_pct.rank0"] == pytest.approx(
        95
    )
    assert m["server_cpu_pct"] == pytest.approx(115) and m["server_cpu_ms_per_1k_tok"] == pytest.approx(
        1e6 * 4.6 / 2000
    )
    assert m["server_cpu_ms_per_1k_tok.launcher"] == pytest.approx(400)
    # the baseline's: only launch 0 has its account (2 s, 500 tokens); the name made a metric key
    assert m["baseline_server_cpu_pct.sglang__scheduler_TP0"] == pytest.approx(50)
    assert m["baseline_server_cpu_ms_per_1k_tok"] == pytest.approx(2000)
    assert host.server_cpu(launches[2:], runs, []) == {}
    said = host.describe_server_cpu(m)
    assert said == (
        "server CPU over the timed runs, % of one core (CPU ms per 1k tokens): rank0 95% (1900 ms), "
        "launcher 20% (400 ms); all 115% (2300 ms)"
    )
    assert host.describe_server_cpu(m, baseline=True).startswith("baseline server CPU")
    assert host.describe_server_cpu({}) is None
    quiet = {**m, "server_cpu_pct.python": 0.0, "server_cpu_ms_per_1k_tok.python": 0.2}  # the resource tracker
    quiet |= {"server_cpu_pct.launcher": 0.3, "server_cpu_ms_per_1k_tok.launcher": 4.0}  # a front at 0%: named
    assert (
        host.server_cpu_items(quiet)
        == "rank0 95% (1900 ms), launcher 0% (4 ms), 1 more idle (< 0.5% of a core each); all 115% (2300 ms)"
    )
    # a baseline job's own account (benchmark.paired=false) carried as the spec job's baseline server's
    assert host.as_baseline({"server_cpu_pct": 5.0, "server_cpu_pct.rank0": 4.0, "host_load1": 1.0}) == {
        "baseline_server_cpu_pct": 5.0,
        "baseline_server_cpu_pct.rank0": 4.0,
    }


@pytest.mark.parametrize(
    "argv, label",
    [
        (["python3", "-m", "torch._inductor.compile_worker"], "python:torch._inductor.compile_worker"),
        (["python3", "-mjson.tool"], "python:json.tool"),
        (
            ["/usr/bin/python3", "/site/torch/_inductor/compile_worker/__main__.py", "--workers=16"],
            "python:compile_worker",
        ),
        (["python3", "-u", "-X", "importtime", "/srv/tools/warm_cache.py", "-m", "x"], "python:warm_cache"),
        (["python3", "--check-hash-based-pycs", "always", "tools/run.py"], "python:run"),
        (["python3", "-c", "from multiprocessing.resource_tracker import main;main(5)"], "python:mp.resource_tracker"),
        (["python3", "-cfrom multiprocessing.spawn import spawn_main"], "python:mp.spawn"),
        (["python3", "-c", "import time; time.sleep(9)"], "python3"),
        (["python3", "-", "arg"], "python3"),
        (["python3", "-m"], "python3"),
        (["python3"], "python3"),
        ([], "python3"),
    ],
)
def test_an_unnamed_interpreter_is_called_by_what_it_runs(argv, label):
    """A `python3` of the server's tree (torch.compile's worker pool, multiprocessing's helpers) is told by
    its command line; a process that named itself keeps its name, and its command line is never read."""
    assert machine.proc_label("python3", lambda: argv) == label
    assert machine.proc_label("launcher", lambda: pytest.fail("read a named process's command line")) == "launcher"
    assert machine.proc_label("rank0", lambda: pytest.fail("read the command line of a named process")) == "rank0"
    assert machine.proc_label("python3", lambda: (_ for _ in ()).throw(psutil.NoSuchProcess(1))) == "python3"


def test_the_tree_sample_names_a_real_unnamed_child_by_its_module(tmp_path):
    """The same through psutil on real processes: a parent that names itself, and its child, an interpreter
    run as ``python -m sdb_sleeper``, which never does."""
    (tmp_path / "sdb_sleeper.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, sys.executable], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "READY"
        names = sorted(name for name, *_ in machine.tree_sample(parent.pid)["procs"].values())
        assert names == ["launcher", "python:sdb_sleeper"], names
    finally:
        kids = psutil.Process(parent.pid).children(recursive=True)
        for p in [*kids, psutil.Process(parent.pid)]:
            p.kill()
        psutil.wait_procs(kids, timeout=5)
        parent.wait(5)


PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.argv[1], "-m", "sdb_sleeper"])
time.sleep(0.5)
print("READY", flush=True)
while True:
    time.sleep(0.05)
"""
