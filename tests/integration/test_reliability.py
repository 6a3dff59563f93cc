"""Every fault in a sweep ends cleanly: real processes, a fault-injecting wrapper around the embedded
engine at the process boundary (tests/fault_server.py), real MLflow stores, psutil for leftovers."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from spec_decode.engines.server_process import free_port

from ..conftest import ROOT, SLOTS_DIR, run_py, small
from .conftest import SECRETS

pytestmark = pytest.mark.integration
FAULT = "engine.launcher=[python,tests/fault_server.py]"


def leftovers(marker: str) -> list[psutil.Process]:
    """Processes of ours still alive whose command line or environment carries the marker."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if marker in " ".join(p.info["cmdline"] or []) or p.environ().get("FAULT_MARKER") == marker:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def runs(uri):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    return c, c.search_runs([exp.experiment_id], order_by=["start_time ASC"])


def test_server_exit_during_start_fails_fast_and_the_sweep_goes_on(tmp_path, tmp_store):
    marker = f"m{time.time_ns()}"
    t0 = time.monotonic()
    p = run_py(
        [
            "-m",
            "spec.steps=1,2",
            FAULT,
            "+engine.env.FAULT=start_crash",
            "+engine.env.FAULT_IF_ARG=--speculative-num-steps:1",
            f"+engine.env.FAULT_MARKER={marker}",
            "benchmark.paired=false",  # the job strategy: a baseline job the failed start must not take down
            *small("benchmark.profile=false"),  # the failed start and the sweep going on are the point
            *tmp_store["overrides"],
            f"hydra.sweep.dir={tmp_path}",
        ],
        check=False,
    )
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-2000:]  # the sweep itself finished
    failed = json.loads(next(tmp_path.glob("0_*/results.json")).read_text())
    assert failed["status"] == "FAILED"
    assert "exited with code 3 during start-up" in failed["error"]
    assert "fault: crashing on start (injected)" in failed["error"]  # the log's last lines
    ok = json.loads(next(tmp_path.glob("1_*/results.json")).read_text())
    assert ok["status"] == "FINISHED" and len(ok["runs"]) == 2
    summary = (tmp_path / "sweep_summary.txt").read_text()
    assert "3 job(s): 1 FAILED, 2 FINISHED" in summary, summary  # the baseline, steps=2; steps=1 failed
    assert f"  FAILED {failed['name']}: fault: crashing on start (injected)" in summary
    c, rs = runs(tmp_store["uri"])
    parent = [r for r in rs if r.data.tags.get("spec_decode.role") == "sweep"][0]
    assert parent.info.status == "FAILED"
    bad = [r for r in rs if r.data.tags.get("spec_decode.out_dir", "").endswith(failed["out_dir"].split("/")[-1])]
    assert bad and bad[0].info.status == "FAILED"
    assert "server.log" in {a.path for a in c.list_artifacts(bad[0].info.run_id)}
    assert elapsed < 120
    assert not leftovers(marker)


def test_first_failure_stops_the_sweep_with_fail_fast(tmp_path, tmp_store):
    p = run_py(
        [
            "-m",
            "spec.steps=1,2",
            FAULT,
            "+engine.env.FAULT=start_crash",
            "+engine.env.FAULT_IF_ARG=--speculative-num-steps:1",
            "fail_fast=true",
            "benchmark.paired=false",  # the job strategy: its baseline job counts in the summary
            *small(),
            *tmp_store["overrides"],
            f"hydra.sweep.dir={tmp_path}",
        ],
        check=False,
    )
    assert json.loads(next(tmp_path.glob("0_*/results.json")).read_text())["status"] == "FAILED"
    second = next(tmp_path.glob("1_*"))
    assert re.search(r"skipping \S*spec\.steps=2: an earlier job failed and fail_fast=true", p.stderr), p.stderr
    assert not (second / "server.log").exists() and not (second / "results.json").exists()
    assert "2 job(s): 1 FAILED, 1 FINISHED" in (tmp_path / "sweep_summary.txt").read_text()


def test_failed_start_is_detected_within_two_seconds(tmp_path):
    """Job wall time from launch to FAILED, with the server crashing at once."""
    p = run_py(
        [
            FAULT,
            "+engine.env.FAULT=start_crash",
            "benchmark.baseline_arm=false",
            "tracking=off",
            f"hydra.run.dir={tmp_path}",
        ],
        check=False,
    )
    assert p.returncode == 1
    rec = json.loads((tmp_path / "results.json").read_text())
    assert rec["status"] == "FAILED" and "exited with code 3 during start-up" in rec["error"]
    # the crash is the server log's last write; the job is over (record finished) within 2 s of it
    crashed_at = (tmp_path / "server.log").stat().st_mtime
    assert 0 <= rec["ended_at"] - crashed_at < 2.0, rec["ended_at"] - crashed_at


@pytest.mark.parametrize("fault", ["die_on_request:3", "hang_on_request:3"])
def test_server_dying_or_hanging_mid_run_keeps_finished_runs(tmp_path, fault):
    marker = f"m{time.time_ns()}"
    p = run_py(
        [
            FAULT,
            f"+engine.env.FAULT={fault}",
            "+engine.env.FAULT_GRANDCHILD=1",
            f"+engine.env.FAULT_MARKER={marker}",
            "engine.request_timeout_s=4",
            "benchmark.baseline_arm=false",
            "tracking=off",
            *small("benchmark.runs=5"),
            f"hydra.run.dir={tmp_path}",
        ],
        check=False,
    )
    assert p.returncode == 1
    rec = json.loads((tmp_path / "results.json").read_text())
    assert rec["status"] == "FAILED"
    assert len(rec["runs"]) == 1  # warmup + 1 timed run finished before the 3rd request
    assert ("no answer within 4s" in rec["error"]) if fault.startswith("hang") else ("/generate" in rec["error"])
    time.sleep(0.5)
    assert not leftovers(marker), "server tree left behind"


def test_ctrl_c_kills_the_server_and_ends_runs_killed(tmp_path, tmp_store):
    marker = f"m{time.time_ns()}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            f"hardware.slots_dir={SLOTS_DIR}",
            "spec.steps=1,2",
            FAULT,
            "+engine.env.FAULT=hang_on_request:2",
            "+engine.env.FAULT_IF_ARG=--speculative-num-steps:2",
            "+engine.env.FAULT_GRANDCHILD=1",
            f"+engine.env.FAULT_MARKER={marker}",
            "engine.request_timeout_s=120",
            # one server per job (no baseline arm, no profiled pass): what is killed is the spec server
            *small("benchmark.baseline_arm=false", "benchmark.profile=false"),
            *tmp_store["overrides"],
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        list(tmp_path.glob("1_*/server.log")) and "fault: hang_on_request" in _read(tmp_path, "1_*/server.log")
    ):
        time.sleep(0.2)
    assert list(tmp_path.glob("0_*/results.json")), "first job did not finish in time"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert json.loads(next(tmp_path.glob("0_*/results.json")).read_text())["status"] == "FINISHED"
    killed = json.loads(next(tmp_path.glob("1_*/results.json")).read_text())
    assert killed["status"] == "KILLED"
    _, rs = runs(tmp_store["uri"])
    parent = [r for r in rs if r.data.tags.get("spec_decode.role") == "sweep"][0]
    assert parent.info.status == "KILLED", out[-2000:]
    assert "KILLED" in {r.info.status for r in rs if r.data.params.get("role") == "spec"}
    time.sleep(0.5)
    assert not leftovers(marker)


def _read(d: Path, pattern: str) -> str:
    files = list(d.glob(pattern))
    return files[0].read_text(errors="replace") if files else ""


def test_taken_port_is_replaced_and_two_sweeps_share_one_fresh_store(tmp_path, fresh_store):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        # one spec job per sweep (and its baseline): every launch still asks for the taken port, and both
        # sweeps still create the one fresh store at once
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "run.py"),
                    "-m",
                    f"hardware.slots_dir={SLOTS_DIR}",
                    "spec.steps=1",
                    f"engine.port={port}",
                    "benchmark.paired=false",
                    *small("benchmark.profile=false"),  # the port and the store are the point, not the profile
                    *fresh_store["overrides"],
                    f"hydra.sweep.dir={tmp_path / f's{i}'}",
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(2)
        ]
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        busy.close()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    recs = [json.loads(f.read_text()) for i in range(2) for f in (tmp_path / f"s{i}").rglob("results.json")]
    assert len(recs) == 2 * (1 + 1) and all(r["status"] == "FINISHED" for r in recs)
    assert all(r["launches"][0]["port"] != port for r in recs)
    _, rs = runs(fresh_store["uri"])
    assert len([r for r in rs if r.data.tags.get("spec_decode.role") == "sweep"]) == 2
    assert all(r.info.status == "FINISHED" for r in rs)


def test_dead_tracking_server_keeps_results_and_sync_uploads_once(tmp_path, tmp_store):
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    sweep = tmp_path / "sweep"
    p = run_py(
        [
            "-m",
            "spec.steps=1",
            f"tracking.uri={dead}",
            "benchmark.paired=false",
            *small("benchmark.profile=false"),  # the records and their upload are the point, not the profile
            f"hydra.sweep.dir={sweep}",
        ]
    )  # the job strategy: two records (job + baseline job)
    assert time.monotonic() - t0 < 120
    recs = [json.loads(f.read_text()) for f in sweep.rglob("results.json")]
    assert len(recs) == 2 and all(r["status"] == "FINISHED" for r in recs)
    assert all(any("unreachable" in w for w in r["warnings"]) for r in recs)
    assert "tracking sync" in p.stderr
    sync = [
        sys.executable,
        "-m",
        "spec_decode.views.tracking",
        "sync",
        str(sweep),
        "--uri",
        tmp_store["uri"],
        "--artifact-location",
        str(tmp_path / "art"),
    ]
    first = subprocess.run(sync, cwd=ROOT, capture_output=True, text=True, timeout=120)
    second = subprocess.run(sync, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "uploaded 2 run(s); 0 already" in first.stdout, first.stderr[-2000:]
    assert "uploaded 0 run(s); 2 already" in second.stdout
    _, rs = runs(tmp_store["uri"])
    assert len(rs) == 2 and {r.data.params["role"] for r in rs} == {"spec", "baseline"}


def test_missing_profile_is_reported_not_fatal(tmp_path):
    run_py(
        [
            FAULT,
            "+engine.env.FAULT=drop_profile",
            "benchmark.baseline_arm=false",
            "tracking=off",
            *small(),
            f"hydra.run.dir={tmp_path}",
        ]
    )
    rec = json.loads((tmp_path / "results.json").read_text())
    assert rec["status"] == "FINISHED"
    assert "missing" in rec["profile"] and "cycle_ms" not in rec["metrics"]
    assert any("phase profile missing" in w for w in rec["warnings"])


def test_secrets_never_leave_the_process(headline_sweep):
    """The shared sweep ran with secret-looking variables in run.py's environment (conftest.SECRETS)."""
    values = list(SECRETS.values())
    assert all(headline_sweep.env[k] == v for k, v in SECRETS.items())  # they were really there
    for f in headline_sweep.dir.rglob("*"):
        if f.is_file():
            text = f.read_bytes().decode(errors="replace")
            for v in values:
                assert v not in text, f"{v} leaked into {f}"
    c, rs = runs(headline_sweep.uri)
    assert rs
    for r in rs:
        blob = json.dumps({"params": r.data.params, "tags": r.data.tags})
        assert not [v for v in values if v in blob], r.info.run_name
    db = Path(headline_sweep.uri[len("sqlite:///") :]).read_bytes().decode(errors="replace")
    assert not [v for v in values if v in db]
    artifacts = [f for f in (headline_sweep.root / "mlartifacts").rglob("*") if f.is_file()]
    assert artifacts
    for f in artifacts:
        assert not [v for v in values if v in f.read_bytes().decode(errors="replace")], f


def test_secret_looking_engine_env_is_redacted_in_records():
    from spec_decode.record.provenance import filter_env, redact_env

    env = {"SGLANG_API_KEY": "sk-123456789", "NCCL_PROTO": "LL", "HF_TOKEN": "hf_abcdefgh", "HOME": "/root"}
    assert redact_env(env)["SGLANG_API_KEY"] == "***redacted***"
    assert filter_env(env) == {"NCCL_PROTO": "LL", "SGLANG_API_KEY": "***redacted***"}


def test_a_sweep_in_which_no_job_finished_exits_1(tmp_path):
    """Every job's server crashes at start: the sweep records each FAILED and run.py exits 1 (a script or
    CI must not read it as done); one job of two failing still exits 0 (above)."""
    p = run_py(
        [
            "-m",
            "spec.steps=1,2",
            FAULT,
            "+engine.env.FAULT=start_crash",
            "tracking=off",
            *small(),
            f"hydra.sweep.dir={tmp_path}",
        ],
        check=False,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    assert "no job of the sweep finished (2 recorded, none FINISHED)" in p.stderr
    assert all(json.loads(f.read_text())["status"] == "FAILED" for f in tmp_path.glob("*/results.json"))


def test_a_shared_baseline_that_failed_is_not_launched_again_by_the_next_job(tmp_path):
    """benchmark.paired=false: the sweep's jobs share one baseline job per key. When its launch fails, the
    next job says so and goes on without it; it does not start the failed server again (a Kimi start at
    tp 8 can take half an hour, and what failed it fails it again)."""
    starts = tmp_path / "starts"
    args = [
        "-m",
        "spec.steps=1,2",
        FAULT,
        "+engine.env.FAULT=every:1:start_crash",  # every server crashes at start; the counter counts them
        f"+engine.env.FAULT_COUNTER={starts}",
        "benchmark.paired=false",
        *small("benchmark.profile=false"),
        "tracking=off",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    p = run_py(args, check=False)
    assert p.returncode == 1, p.stderr[-2000:]  # no job finished
    assert starts.read_text() == "xxx", p.stderr[-3000:]  # the baseline once, then each spec server
    assert p.stderr.count("[baseline] measuring the baseline") == 1
    assert "FAILED earlier in this sweep" in p.stderr and "not launched again" in p.stderr
    # the same sweep dir again (its cause perhaps fixed): the earlier sweep's failure is not this one's
    again = run_py(args, check=False)
    assert starts.read_text() == "x" * 6, again.stderr[-3000:]
    assert again.stderr.count("[baseline] measuring the baseline") == 1
