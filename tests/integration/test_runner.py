"""run.py end to end: a real multirun in a subprocess against the embedded engine, MLflow checked
through MlflowClient; single runs; dry runs; bad overrides fail before any server starts."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ..conftest import run_py

pytestmark = pytest.mark.integration
TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


def runs_of(uri: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    return c, c.search_runs([exp.experiment_id], order_by=["start_time ASC"])


def test_sweep_steps_by_nccl_gives_parent_children_and_paired_baselines(
    tmp_path, headline_sweep, headline_report_by_flag
):
    # the shared sweep (tests/integration/conftest.py): -m spec.steps=1,3 nccl=tuned,default, small jobs,
    # with a stray NCCL_PROTO=Simple in run.py's environment
    sweep, proc = headline_sweep.dir, headline_sweep.proc
    c, runs = runs_of(headline_sweep.uri)
    parents = [r for r in runs if r.data.tags.get("spec_decode.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    spec = [r for r in kids if r.data.params["role"] == "spec"]
    base = [r for r in kids if r.data.params["role"] == "baseline"]
    # one baseline strategy per job: paired (the default where two servers fit), so no baseline jobs
    assert len(spec) == 4 and base == [] and not (sweep / "baselines").exists()
    assert all(r.info.status == "FINISHED" for r in kids)
    for r in spec:
        m = r.data.metrics
        for key in (
            "throughput_tok_s",
            "throughput_tok_s_ci95_lo",
            "accept_len",
            "cycle_ms",
            "draft_ms",
            "verify_ms",
            "extend_ms",
            "other_ms",
            "speedup_vs_baseline",
        ):
            assert key in m, key
        assert m["accept_len"] > 1.5
        hist = c.get_metric_history(r.info.run_id, "run_throughput_tok_s")
        assert sorted(h.step for h in hist) == [0, 1]
        # the name leads with what varies
        assert r.info.run_name == (
            f"steps={r.data.params['spec.steps']} nccl={r.data.params['nccl']} max_new_tokens=48 runs=2 warmup=1"
        )
        # the server env as read back from the live process
        rec = json.loads(
            Path(c.download_artifacts(r.info.run_id, "results.json", str(tmp_path / r.info.run_id))).read_text()
        )
        nccl = {k: v for k, v in rec["server_env"].items() if k.startswith("NCCL_")}
        assert nccl == (TUNED if r.data.params["nccl"] == "tuned" else {})
        assert rec["speedup_vs_baseline"]["ratio"] == pytest.approx(m["speedup_vs_baseline"], abs=5e-5)
        assert m["throughput_tok_s"] == round(m["throughput_tok_s"], 1)  # logged at its precision
        # paired baseline (the default on the embedded engine): one baseline run per spec run
        assert rec["speedup_vs_baseline"]["method"] == "paired"
        assert len(rec["baseline_runs"]) == len(rec["runs"]) == 2
        ratios = [a["throughput_tok_s"] / b["throughput_tok_s"] for a, b in zip(rec["runs"], rec["baseline_runs"])]
        assert rec["speedup_vs_baseline"]["per_pair"] == pytest.approx(ratios)
        assert "vs_baseline_job" not in rec["speedup_vs_baseline"] and rec["baseline"]["out_dir"] is None
    # the experiment opens in the runs view, with a description and a saved view of the key metrics
    exp = c.get_experiment(parents[0].info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "speculative-decoding" in exp.tags["mlflow.note.content"].lower()
    view = json.loads(exp.tags["mlflow.sharedViewState.spec-decode-speedup"])
    state = json.loads(view["state"])
    assert "metrics.`speedup_vs_baseline`" in state["selectedColumns"]
    assert state["runsExpanded"] == {parents[0].info.run_id: True}
    assert parents[0].data.tags["mlflow.note.content"].count("| FINISHED") == 4
    # where to look: the sweep ends with its dir, the parent run, the UI command and the report command
    tail = proc.stderr[proc.stderr.rindex("sweep dir:") :]
    assert str(sweep) in tail and parents[0].info.run_id in tail and "mlflow ui --backend-store-uri" in tail
    assert f"python -m spec_decode.views.report {sweep}" in tail
    # run.log holds the job's console output
    job_logs = sorted(sweep.glob("*/run.log"))
    assert len(job_logs) == 4 and all("[FINISHED]" in p.read_text() for p in job_logs)
    summary = (sweep / "sweep_summary.txt").read_text()
    assert "4 job(s): 4 FINISHED" in summary  # paired: no baseline jobs
    assert "cost model" in summary and "predicted best: steps=" in summary
    # the report CLI renders the same sweep from its results.json files
    plots = tmp_path / "plots"
    rep = subprocess.run(
        [sys.executable, "-m", "spec_decode.views.report", str(sweep), "--plots", str(plots)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    assert "speedup 95% CI" in rep.stdout and rep.stdout.count(" FINISHED ") == 4  # one row per job
    assert "4 job(s): 4 FINISHED" in rep.stdout
    for png in ("throughput_vs_steps.png", "phases.png", "accept_len_vs_steps.png"):
        assert (plots / png).stat().st_size > 10_000
    assert {p.path for p in c.list_artifacts(parents[0].info.run_id)} >= {
        "sweep_summary.txt",
        "sweep_summary.json",
        "plots",
    }
    # report --mlflow-run writes under the directory it names, nothing in the cwd (the shared run of it,
    # tests/integration/conftest.py: headline_report_by_flag, from an empty dir; test_store_uri reads it too)
    rep, cwd = headline_report_by_flag.proc, headline_report_by_flag.dir
    assert rep.args[-4:] == ["--mlflow-run", parents[0].info.run_id, "--uri", headline_sweep.uri]
    assert rep.returncode == 0, rep.stderr
    assert list(cwd.iterdir()) == []
    named = Path(rep.stderr.split("downloaded the sweep's results.json files to ", 1)[1].split()[0])
    assert {p.name for p in named.glob("*.png")} == {
        "throughput_vs_steps.png",
        "phases.png",
        "accept_len_vs_steps.png",
        "speedup_vs_steps.png",
        "acceptance_histogram.png",
        "accept_rate_by_position.png",
    }


def test_single_run_logs_a_standalone_run_with_real_metrics(single_job):
    # the shared single job (tests/integration/conftest.py): `python run.py` (small), its own store
    rec = json.loads((single_job.dir / "results.json").read_text())
    assert rec["status"] == "FINISHED" and rec["engine"]["name"] == "embedded"
    assert rec["engine"]["nccl_inert"] == "on a CPU (no NCCL runs)"  # the engine's answer: nccl is an A/A axis
    assert len(rec["runs"]) == 2 and all(r["completion_tokens"] == 48 for r in rec["runs"])
    assert rec["acceptance"]["accept_len"] > 1.5 and rec["profile"]["cycles"] > 0
    _, runs = runs_of(single_job.uri)
    job = [r for r in runs if r.data.params.get("role") == "spec"]
    assert len(job) == 1 and "mlflow.parentRunId" not in job[0].data.tags
    assert job[0].data.metrics["throughput_tok_s"] == pytest.approx(rec["metrics"]["throughput_tok_s"], abs=0.05)


def test_dry_run_prints_commands_and_env_and_launches_nothing(tmp_path, fresh_store):
    t0 = time.monotonic()
    p = run_py(
        [
            "-m",
            "engine=sglang",
            "hardware=rtx_pro_6000x8",
            "model=kimi_k25",
            "drafter=kimi_k25_eagle3",
            "spec.steps=1,3",
            "nccl=tuned,default",
            "dry_run=true",
            *fresh_store["overrides"],
            f"hydra.sweep.dir={tmp_path / 'dry'}",
        ],
        env={"HF_HUB_CACHE": str(tmp_path / "hub")},  # an empty cache, whatever this machine's holds
    )
    out = p.stdout
    assert out.count("# server command:") == 4
    assert "sglang.launch_server" in out and "--tp-size 8" in out and "--cuda-graph-max-bs-decode" in out
    assert out.count("NCCL_PROTO=LL") == 2
    # weights absent, and no DVC pointer for them: warned, not fatal, with what to do first
    assert "drafter.path=models/drafters/kimi-k2.5-eagle3: weights not found" in out
    assert "this repo has no DVC pointer for it yet (`dvc pull` has nothing to fetch)" in out
    # the target is a hub id that is not in this machine's Hugging Face cache: warned here, an error on the box
    assert "# warning: model.path=moonshotai/Kimi-K2.5 is neither a local directory" in out
    assert not (tmp_path / "mlflow.db").exists()
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize(
    "override,named",
    [
        ("spec.steps=0", "spec.steps=0"),
        ("spec.steps=three", "spec.steps"),
        ("nccl=fast", "nccl"),
        ("benchmark.runs=0", "benchmark.runs=0"),
        ("drafter.path=models/missing_drafter", "drafter.path=models/missing_drafter"),
    ],
)
def test_bad_input_fails_before_any_server_starts(tmp_path, tmp_store, override, named):
    p = run_py([override, *tmp_store["overrides"], f"hydra.run.dir={tmp_path / 'job'}"], check=False)
    assert p.returncode != 0
    assert named in p.stderr
    assert not (tmp_path / "job" / "server.log").exists()
