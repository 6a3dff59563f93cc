"""The profiler plugin live in a multi-rank server: the embedded engine at tp=2 (gloo), the plugin
loaded from its entry point in every rank process, servers stopped as the runner stops them (SIGTERM,
grace, SIGKILL). No fake module: these are the code paths that run inside SGLang's ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.parsers.profile import read_profile

from ..conftest import ROOT, run_py, small

pytestmark = pytest.mark.integration
TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


def job(tmp_path, *overrides, env=None, tracking=("tracking=off",)) -> dict:
    run_py(
        [
            "hardware.tp_size=2",
            "benchmark.baseline_arm=false",
            *tracking,
            *small(),
            *overrides,
            f"hydra.run.dir={tmp_path}",
        ],
        env=env,
    )
    return json.loads((tmp_path / "results.json").read_text())


@dataclass(frozen=True)
class Shared:
    dir: Path
    rec: dict
    uri: str


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Shared:
    """One tp=2 job that five tests read, each with its own assertions (a job is ~10 s of two rank
    processes here): the flusher off (only the SIGTERM handler writes cycles), 3 timed runs then a
    profiled pass of 2 pairs, nccl=tuned with a stray NCCL_PROTO in run.py's environment, logged to its
    own MLflow store."""
    root = tmp_path_factory.mktemp("profile_ranks")
    db, art = root / "mlflow.db", root / "mlartifacts"
    rec = job(
        root / "job",
        "spec.steps=2",
        "benchmark.runs=3",
        "benchmark.profile_pairs=2",
        "nccl=tuned",
        env={"SPEC_DECODE_PROFILE_FLUSH_S": "0", "NCCL_PROTO": "Simple"},
        tracking=(f"tracking.uri=sqlite:///{db}", f"tracking.artifact_location={art}"),
    )
    return Shared(dir=root / "job", rec=rec, uri=f"sqlite:///{db}")


def test_two_ranks_write_their_own_profiles_and_the_runner_uses_rank_0(shared):
    tmp_path, rec = shared.dir, shared.rec
    files = sorted(p.name for p in tmp_path.glob("profile.dp*.tp*.jsonl"))
    assert files == ["profile.dp0.tp0.jsonl", "profile.dp0.tp1.jsonl"]
    for r in (0, 1):
        lines = [json.loads(x) for x in (tmp_path / f"profile.dp0.tp{r}.jsonl").read_text().splitlines()]
        assert lines and {x["rank"] for x in lines} == {r}
    prof = rec["profile"]
    verify_ct = sum(r["spec_verify_ct"] for r in rec["profiled_runs"])  # the pass the profile is of
    assert prof["rank"] == 0 and prof["ranks"] == 2
    assert prof["cycles"] == verify_ct and prof["complete"]  # one rank's cycles, not both ranks'
    assert prof["non_cycle_ms_per_request"] > 0  # not minus a second rank's cycle time
    agree = prof["rank_agreement"]
    assert set(agree["ranks"]) == {"1"} and agree["ranks"]["1"]["cycles"] == prof["cycles"]
    assert "ok" in agree
    assert rec["metrics"]["accept_len"] > 1.5 and rec["metrics"]["verify_ms"] > 0


def test_sigterm_writes_the_tail_no_cycle_lost(shared):
    # Flusher off (SPEC_DECODE_PROFILE_FLUSH_S=0): only the plugin's SIGTERM handler (the runner's stop)
    # can write the cycles.
    tmp_path, rec = shared.dir, shared.rec
    prof = rec["profile"]
    assert prof["cycles"] == sum(r["spec_verify_ct"] for r in rec["profiled_runs"]) and prof["complete"]
    # every rank drained its buffer on SIGTERM (read as the job reads them: a line that an interrupted
    # drain wrote twice is one cycle)
    ranks = {r: len(read_profile(tmp_path / f"profile.dp0.tp{r}.jsonl")) for r in (0, 1)}
    assert ranks[0] == ranks[1]


def test_timed_runs_run_with_dormant_hooks_and_the_profiled_pass_reports_its_effect(shared):
    tmp_path, rec = shared.dir, shared.rec  # benchmark.runs=3, benchmark.profile_pairs=2
    cycles = [c for f in tmp_path.glob("profile.dp*.tp*.jsonl") for c in map(json.loads, f.read_text().splitlines())]
    timed = [(r["start_wall"], r["end_wall"]) for r in rec["runs"]]
    assert cycles and not [c for c in cycles for lo, hi in timed if lo <= c["t"] <= hi]  # none timed
    on = rec["profiled_runs"]
    assert len(on) == 2 and all(r["start_wall"] > timed[-1][1] for r in on)  # after the timed runs
    prof = rec["profile"]
    assert prof["cycles"] == sum(r["spec_verify_ct"] for r in on) and prof["complete"]
    assert prof["measured_in_tok_s"] == pytest.approx(sum(r["throughput_tok_s"] for r in on) / 2)
    eff = rec["profile_pass"]["effect"]
    assert eff["pairs"] == 2 and eff["ci95_lo_pct"] <= eff["effect_pct"] <= eff["ci95_hi_pct"]
    assert rec["metrics"]["profiler_effect_pct"] == pytest.approx(eff["effect_pct"])
    assert len(rec["profile_pass"]["dormant_tok_s"]) == 2
    checks = {c["name"]: c["ok"] for c in rec["checks"]}  # the profile against the pass's own counters
    assert checks["profile_vs_counters"] is True and checks["phases_within_cycle"] is True


@dataclass(frozen=True)
class Job:
    dir: Path
    rec: dict


@pytest.fixture(scope="module")
def unprofiled_default(tmp_path_factory) -> Job:
    """One tp=2 job with benchmark.profile=false and nccl=default, a stray NCCL_PROTO in run.py's
    environment, read by the two tests that each ran a job of their own: no profile at all, and the
    default NCCL profile (none) in every process. One run.py and one server launch (front and two ranks),
    not two; the server's environment is read at its start, with or without the profiler."""
    d = tmp_path_factory.mktemp("unprofiled_default") / "job"
    rec = job(
        d, "nccl=default", "spec.steps=2", "benchmark.runs=1", "benchmark.profile=false", env={"NCCL_PROTO": "Simple"}
    )
    return Job(dir=d, rec=rec)


def test_profile_false_means_no_profile_at_all(unprofiled_default):
    tmp_path, rec = unprofiled_default.dir, unprofiled_default.rec
    assert rec["config"]["benchmark"]["profile"] is False
    assert not list(tmp_path.glob("profile*")) and rec["profiled_runs"] == [] and rec["profile_pass"] is None
    assert "SPEC_DECODE_PROFILE" not in json.dumps(rec["server_env"])


FAKE_SGLANG_RANK = r"""
import sys, types
from types import SimpleNamespace
# SGLang's parallel state as sglang/srt/runtime_context.py 1285 publishes it in a scheduler process
# (sglang is not installed here): a --dp-size 2 layout, both replicas' schedulers at tp_rank 0.
mod = types.ModuleType("sglang.srt.runtime_context")
par = SimpleNamespace(tp_rank=0, dp_rank=int(sys.argv[2]), attn_dp_rank=0)
mod.get_parallel = lambda: par
sys.modules["sglang.srt.runtime_context"] = mod
from spec_decode.profiler import plugin
prof = plugin.Profiler(sys.argv[1])
class Mode:
    def __init__(self, idle): self.idle = idle
    def is_idle(self): return self.idle
def forward_batch_generation(worker, batch):
    prof.phase("verify")(lambda: None)
    return SimpleNamespace(accept_lens=[2])
for i in range(4):
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid=f"r{sys.argv[2]}")], forward_mode=Mode(i == 1))
    prof.around_cycle(forward_batch_generation, SimpleNamespace(), batch)
prof.flush()
"""


def test_two_dp_replicas_at_tp_rank_0_write_two_files_never_one(tmp_path):
    path = tmp_path / "profile.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", FAKE_SGLANG_RANK, str(path), str(dp)]) for dp in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert sorted(f.name for f in tmp_path.glob("profile.*.jsonl")) == [
        "profile.dp0.tp0.jsonl",
        "profile.dp1.tp0.jsonl",
    ]
    for dp in (0, 1):
        lines = [json.loads(x) for x in (tmp_path / f"profile.dp{dp}.tp0.jsonl").read_text().splitlines()]
        assert len(lines) == 3  # the idle batch is no cycle
        assert {(x["dp"], x["tp"]) for x in lines} == {(dp, 0)} and {x["rids"][0] for x in lines} == {f"r{dp}"}


@pytest.mark.parametrize("nccl", ["tuned", "default"])
def test_every_process_carries_exactly_the_nccl_profile(request, nccl):
    # a stray shell variable (NCCL_PROTO=Simple in run.py's environment) must not reach any rank; tuned is
    # the shared job's profile, default the unprofiled job's
    rec = request.getfixturevalue("shared" if nccl == "tuned" else "unprofiled_default").rec
    assert rec["config"]["nccl"]["name"] == nccl
    procs = rec["server_env_processes"]
    assert len(procs) >= 3  # the front and two ranks
    for env in procs.values():
        assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == (TUNED if nccl == "tuned" else {})


def doctor(*args, env=None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "spec_decode.runner.doctor", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doctor_passes_on_a_healthy_tp2_server():
    p = doctor("hardware.tp_size=2", "spec.steps=2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[OK] profile from rank 0" in p.stdout and "6 passed, 0 failed" in p.stdout


def test_doctor_names_an_excluded_plugin_and_the_empty_profile():
    p = doctor("spec.steps=2", env={"SGLANG_PLUGINS": "some_other_plugin"})
    assert p.returncode == 1
    assert "[FAIL] profiler plugin installed: `spec_decode_profiler` is installed but SGLANG_PLUGINS" in p.stdout
    assert "[FAIL] profile from rank 0: no profile lines" in p.stdout
    assert "what to do:" in p.stdout


def test_doctor_items_for_a_missing_plugin_and_a_wrong_hook_target():
    from spec_decode.profiler.plugin import TARGETS
    from spec_decode.runner.doctor import check_entry_point, check_hook_targets

    missing = check_entry_point([], None)
    assert not missing.ok and "no `spec_decode_profiler` entry point" in missing.detail
    assert "pip install -e ." in missing.fix
    wrong = [(TARGETS["embedded"][0][0].replace(".cycle", ".cycle_v2"), None), *TARGETS["embedded"][1:]]
    item = check_hook_targets("embedded", wrong)
    assert not item.ok and "Decoder.cycle_v2 does not exist" in item.detail
    assert check_hook_targets("embedded").ok


def test_benchmark_runs_lead_to_their_drafters_training(shared):
    """The lineage tags: a benchmark run names its drafter's weights, training data and training run."""
    training = json.loads((ROOT / "models/tiny/drafter/training.json").read_text())
    c = MlflowClient(shared.uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    (run,) = c.search_runs([exp.experiment_id])
    tags = run.data.tags
    assert tags["drafter.weights_sha256"] == training["weights_sha256"]
    assert tags["drafter.data_md5"] == training["data"]["file_md5"]
    assert tags["drafter.data_samples"] == str(training["data"]["samples"])
