"""Sweeps through a real SLURM cluster: `hydra/launcher=slurm_cpu` submits one `sbatch --array`, each
task runs the runner on the node, the runner starts the embedded engine (through the fault-injecting
wrapper where a test needs a fault). Real MLflow sqlite stores, real scancel, psutil for leftovers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from spec_decode.engines.server_process import free_port
from spec_decode.runner.slots import allocate

from ..conftest import ROOT, run_py
from .conftest import slurm_sweep, squeue

pytestmark = pytest.mark.slurm
FAULT = "engine.launcher=[python,tests/fault_server.py]"


def records(sweep_dir: Path) -> dict[str, dict]:
    """results.json of every job and baseline under the sweep dir, by directory relative to it."""
    return {str(p.parent.relative_to(sweep_dir)): json.loads(p.read_text()) for p in sweep_dir.rglob("results.json")}


def job(recs: dict[str, dict], num: int) -> dict:
    """The record of job number `num` (its own dir `<num>_<overrides>`, not a baseline inside it)."""
    [rec] = [r for d, r in recs.items() if d.startswith(f"{num}_") and "/" not in d]
    return rec


def mlflow_runs(uri: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    rs = c.search_runs([exp.experiment_id])
    parents = [r for r in rs if r.data.tags.get("spec_decode.role") == "sweep"]
    assert len(parents) == 1, [r.data.tags for r in rs]
    kids = [r for r in rs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], kids


def array_tasks(sweep_dir: Path) -> list[str]:
    """The SLURM job ids submitit used (folders `<array id>_<task>` under .submitit)."""
    return sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))


def server_window(rec: dict) -> tuple[float, float]:
    """From the warmup's start to the last timed run's end: while the job's server was serving."""
    first = min(r["start_wall"] for r in rec["runs"]) - sum(x.get("warmup_s", 0) for x in rec["launches"])
    return first, max(r["end_wall"] for r in rec["runs"])


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def leftovers(marker: str) -> list[psutil.Process]:
    """Processes still alive that carry the marker in their command line or environment."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and (
                marker in " ".join(p.info["cmdline"] or []) or p.environ().get("FAULT_MARKER") == marker
            ):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def test_sweep_through_sbatch_shares_one_baseline_across_array_tasks(tmp_path, tmp_store, job_name):
    """The issue's sweep: 2 spec jobs as 2 array tasks that start together, 1 baseline measured once."""
    sweep, starts = tmp_path / "sweep", tmp_path / "server_starts"
    # The wrapper's counter mode counts every engine start (it would crash only the 1000th).
    # engine.port=0: any free port, so no start is retried because something else holds port 30000.
    run_py(
        slurm_sweep(
            "spec.steps=1,3",
            "engine.port=0",
            FAULT,
            "+engine.env.FAULT=every:1000:start_crash",
            f"+engine.env.FAULT_COUNTER={starts}",
            *tmp_store["overrides"],
            job_name=job_name,
            sweep_dir=sweep,
            slots_dir=tmp_path / "slots",
        ),
        timeout=300,
    )
    tasks = array_tasks(sweep)
    assert len(tasks) == 2 and len({t.split("_")[0] for t in tasks}) == 1, tasks  # one sbatch --array
    assert "#SBATCH --array=0-1%" in next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()
    recs = records(sweep)
    assert sorted(r["role"] for r in recs.values()) == ["baseline", "spec", "spec"]
    assert all(r["status"] == "FINISHED" for r in recs.values()), {d: r["error"] for d, r in recs.items()}
    [base] = [r for r in recs.values() if r["role"] == "baseline"]
    assert Path(base["out_dir"]).parent == sweep / "baselines"  # shared through the sweep dir
    assert starts.read_text() == "xxx", "engine starts: expected 3 (1 baseline + 2 spec)"
    for num in (0, 1):
        spec = job(recs, num)
        assert spec["baseline"]["out_dir"] == base["out_dir"]
        assert spec["metrics"]["speedup_vs_baseline"] > 0
    # Both tasks were on the node at once; the default slot pool (hardware.parallel_jobs=1) still let
    # one server run at a time: the three servers never overlapped, all on slot cpu0.
    spans = [(r["started_at"], r["ended_at"]) for r in (job(recs, 0), job(recs, 1))]
    assert overlap(*spans), spans
    windows = sorted(server_window(r) for r in recs.values())
    assert all(not overlap(a, b) for i, a in enumerate(windows) for b in windows[i + 1 :]), windows
    assert {tuple(r["slots"]) for r in recs.values()} == {("cpu0",)}
    parent, kids = mlflow_runs(tmp_store["uri"])
    assert parent.info.status == "FINISHED"
    assert sorted(k.data.params["role"] for k in kids) == ["baseline", "spec", "spec"]
    assert all(k.info.status == "FINISHED" and "throughput_tok_s" in k.data.metrics for k in kids)
    [bkid] = [k for k in kids if k.data.params["role"] == "baseline"]
    assert {k.data.tags.get("baseline_run_id") for k in kids if k.data.params["role"] == "spec"} == {bkid.info.run_id}
    assert not squeue(job_name)


def test_two_array_tasks_on_one_node_get_their_own_slot_and_port(tmp_path, tmp_store, job_name):
    """hardware.parallel_jobs=2: two tasks on the node serve at the same time on disjoint slots and
    ports (both ask for the same engine.port; one gets it, the other a free one)."""
    sweep, arrived, port = tmp_path / "sweep", tmp_path / "arrived", free_port()
    # Each server holds its first request until both serve (or 30 s), so the two overlap whenever the
    # allocator lets them; both runners ask for the same port at about the same time.
    run_py(
        slurm_sweep(
            "spec.steps=1,2",
            "hardware.parallel_jobs=2",
            "benchmark.baseline_arm=false",
            f"engine.port={port}",
            "tracking=off",
            "engine.launcher=[python,tests/slurm/rendezvous_server.py]",
            f"+engine.env.RENDEZVOUS_DIR={arrived}",
            "+engine.env.RENDEZVOUS_N=2",
            job_name=job_name,
            sweep_dir=sweep,
            slots_dir=tmp_path / "slots",
        ),
        timeout=300,
    )
    a, b = (job(records(sweep), n) for n in (0, 1))
    assert a["status"] == b["status"] == "FINISHED", (a["error"], b["error"])
    assert overlap(server_window(a), server_window(b)), "the two servers did not run at once"
    assert set(a["slots"]) | set(b["slots"]) == {"cpu0", "cpu1"}
    ports = {a["launches"][0]["port"], b["launches"][0]["port"]}
    assert len(ports) == 2 and port in ports, (port, ports)
    assert json.loads((tmp_path / "slots" / "cpu.json").read_text()) == {}  # both slots given back


def test_server_crash_under_slurm_fails_its_job_and_the_sweep_goes_on(tmp_path, tmp_store, job_name):
    sweep, marker = tmp_path / "sweep", f"m{time.time_ns()}"
    p = run_py(
        slurm_sweep(
            "spec.steps=1,2",
            "benchmark.baseline_arm=false",
            FAULT,
            "+engine.env.FAULT=start_crash",
            "+engine.env.FAULT_IF_ARG=--speculative-num-steps:1",
            f"+engine.env.FAULT_MARKER={marker}",
            *tmp_store["overrides"],
            job_name=job_name,
            sweep_dir=sweep,
            slots_dir=tmp_path / "slots",
        ),
        timeout=300,
    )
    recs = records(sweep)
    bad, ok = job(recs, 0), job(recs, 1)
    assert bad["status"] == "FAILED"
    assert "exited with code 3 during start-up" in bad["error"]
    assert "fault: crashing on start (injected)" in bad["error"]  # server.log's tail
    assert ok["status"] == "FINISHED" and len(ok["runs"]) == 2
    summary = (sweep / "sweep_summary.txt").read_text()
    assert "2 job(s): 1 FAILED, 1 FINISHED" in summary, summary
    assert "2 job(s): 1 FAILED, 1 FINISHED" in p.stderr  # also printed by the submitting process
    parent, kids = mlflow_runs(tmp_store["uri"])
    assert parent.info.status == "FAILED"
    assert sorted(k.info.status for k in kids) == ["FAILED", "FINISHED"]
    c = MlflowClient(tmp_store["uri"])
    [failed] = [k for k in kids if k.info.status == "FAILED"]
    assert "server.log" in {x.path for x in c.list_artifacts(failed.info.run_id)}
    assert not leftovers(marker)


def test_scancel_of_a_running_task_leaves_no_server_and_no_running_run(tmp_path, tmp_store, job_name):
    """scancel (SIGTERM, then SIGKILL after KillWait) of the task whose server hangs; the other finishes."""
    sweep, marker = tmp_path / "sweep", f"m{time.time_ns()}"
    argv = slurm_sweep(
        "spec.steps=1,2",
        "hardware.parallel_jobs=2",
        "benchmark.baseline_arm=false",
        FAULT,
        "+engine.env.FAULT=hang_on_request:2",
        "+engine.env.FAULT_IF_ARG=--speculative-num-steps:2",
        "+engine.env.FAULT_GRANDCHILD=1",
        f"+engine.env.FAULT_MARKER={marker}",
        "engine.request_timeout_s=300",
        *tmp_store["overrides"],
        job_name=job_name,
        sweep_dir=sweep,
        slots_dir=tmp_path / "slots",
    )
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        log = None
        while time.monotonic() < deadline:
            log = next(sweep.glob("1_*/server.log"), None)
            if log and "fault: hang_on_request" in log.read_text(errors="replace"):
                break
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"task 1's server never hung (log: {log})")
        [task] = [jid for jid, state in squeue(job_name) if jid.endswith("_1") and state == "RUNNING"]
        t_cancel = time.monotonic()
        subprocess.run(["scancel", task], check=True, timeout=30)
        out, _ = proc.communicate(timeout=240)
        sweep_s = time.monotonic() - t_cancel
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"sweep ended {sweep_s:.1f} s after scancel")
    recs = records(sweep)
    assert job(recs, 1)["status"] in {"KILLED", "FAILED"}, out[-3000:]
    assert job(recs, 0)["status"] == "FINISHED", out[-3000:]
    parent, kids = mlflow_runs(tmp_store["uri"])
    assert len(kids) == 2 and "RUNNING" not in {k.info.status for k in kids}
    assert parent.info.status in {"KILLED", "FAILED"}
    summary = (sweep / "sweep_summary.txt").read_text()
    # counts by status, alphabetical: "1 FAILED, 1 FINISHED" or "1 FINISHED, 1 KILLED" (scancel = SIGTERM)
    assert re.search(r"2 job\(s\): (1 FAILED, 1 FINISHED|1 FINISHED, 1 KILLED)", summary), summary
    assert not leftovers(marker), "server (or its child) left on the node"
    assert not squeue(job_name)


def test_scancel_of_a_task_waiting_for_its_slot_ends_its_run_killed(tmp_path, tmp_store, job_name):
    """scancel while the runner waits for the node's only slot (no server yet whose death would wake it):
    the run must still end KILLED, and the sweep must end (submitit needs the job's result: without
    sacct it cannot tell a killed job from a running one)."""
    sweep, slots = tmp_path / "sweep", tmp_path / "slots"
    argv = slurm_sweep(
        "spec.steps=2",
        "benchmark.baseline_arm=false",
        *tmp_store["overrides"],
        job_name=job_name,
        sweep_dir=sweep,
        slots_dir=slots,
    )
    with allocate("cpu", ["cpu0"], 1, slots):  # this test holds the node's one CPU slot
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:  # the job has opened its run and waits for the slot
                # (.submitit appears after the parent run exists: our client never races its creation)
                if (sweep / ".submitit").is_dir() and _open_job_runs(tmp_store["uri"]) == 1:
                    break
                assert proc.poll() is None, proc.communicate()[0][-3000:]
                time.sleep(0.5)
            else:
                pytest.fail("the job never came to wait for the slot")
            [task] = [jid for jid, state in squeue(job_name) if state == "RUNNING"]
            subprocess.run(["scancel", task], check=True, timeout=30)
            # The sweep must end; a task that SLURM ended without a record never will (fail fast then).
            deadline, gone = time.monotonic() + 90, None
            while proc.poll() is None and time.monotonic() < deadline:
                if not recs_written(sweep) and task not in {jid for jid, _ in squeue(job_name)}:
                    gone = gone or time.monotonic()
                    if time.monotonic() - gone > 5:
                        break
                time.sleep(0.5)
            assert proc.poll() is not None, "the sweep did not end: the cancelled job left no result"
            out, _ = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()  # without the job's result the sweep would wait forever
    recs = records(sweep)
    assert recs, "the cancelled job wrote no results.json"
    assert job(recs, 0)["status"] == "KILLED" and "SIGTERM" in job(recs, 0)["error"], out[-3000:]
    parent, kids = mlflow_runs(tmp_store["uri"])
    assert [k.info.status for k in kids] == ["KILLED"]
    assert parent.info.status == "KILLED"
    assert "1 job(s): 1 KILLED" in (sweep / "sweep_summary.txt").read_text()
    assert not squeue(job_name)


def recs_written(sweep_dir: Path) -> bool:
    return any(sweep_dir.glob("*/results.json"))


def _open_job_runs(uri: str) -> int:
    """MLflow runs of jobs (not the sweep's parent) still RUNNING."""
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    runs = c.search_runs([exp.experiment_id]) if exp else []
    return sum(r.info.status == "RUNNING" and "spec_decode.out_dir" in r.data.tags for r in runs)
