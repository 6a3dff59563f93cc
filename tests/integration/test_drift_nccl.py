"""Issue 44: the seed's lost-NCCL incident as a user replays it -- `nccl=tuned`, then `nccl=default` on the
same hardware/model/engine -- gives a DRIFT line naming the NCCL difference (console, results.json, MLflow),
with the paired default and with separate baseline jobs; NCCL_* exported in the shell are named; a sweep
that varies nccl on purpose raises no such alarm (real run.py, real engine, real MLflow store in tmp)."""

import os

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.record import results

from ..conftest import run_py, small

pytestmark = pytest.mark.integration

LOST = "NCCL_PROTO was LL in the earlier runs, unset now"
PROFILE = "nccl=tuned in the earlier runs, nccl=default now"
# the shell's NCCL variables: whatever the test runner's shell has, minus them, plus ours
SHELL = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}


def drift_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "DRIFT:" in line]


def test_tuned_then_default_paired_gives_drift_and_the_shell_nccl_is_named(tmp_path, tmp_store):
    job = ["spec.steps=1", *small("benchmark.profile=false"), *tmp_store["overrides"]]
    run_py([*job, "nccl=tuned", f"hydra.run.dir={tmp_path / 'tuned'}"], env=SHELL)
    env = {**SHELL, "NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}  # exported in the user's shell
    p = run_py([*job, "nccl=default", f"hydra.run.dir={tmp_path / 'default'}"], env=env)
    rec = results.read(tmp_path / "default")
    assert rec.baseline_runs and rec.drift is not None, rec.warnings  # the paired baseline arm was checked
    assert rec.drift.env_differences[0] == PROFILE and LOST in rec.drift.env_differences, rec.drift.env_differences
    assert rec.drift.message.startswith("DRIFT: ") and LOST in rec.drift.message
    assert rec.drift.message in rec.warnings
    assert any(LOST in line for line in drift_lines(p.stderr)), p.stderr[-3000:]  # the console
    shell = [w for w in rec.warnings if w.startswith("NCCL variables exported in this shell")]
    assert shell and "NCCL_ALGO=Tree, NCCL_PROTO=Simple" in shell[0] and "nccl=default alone decides" in shell[0]
    assert "NCCL variables exported in this shell are dropped" in p.stderr
    assert "NCCL_PROTO" not in (rec.server_env or {})  # dropped indeed
    tags = MlflowClient(tmp_store["uri"]).get_run(rec.mlflow_run_id).data.tags
    assert LOST in tags["warnings"] and "NCCL_ALGO=Tree" in tags["warnings"]
    first = results.read(tmp_path / "tuned")
    assert first.drift is None  # nothing earlier
    assert not [w for w in first.warnings if "exported in this shell" in w]  # a clean shell: nothing said


def test_tuned_then_default_with_baseline_jobs_gives_drift_from_the_records(tmp_path):
    job = ["spec.steps=1", "benchmark.paired=false", *small("benchmark.profile=false")]
    off = ["tracking=off", f"tracking.results_dirs=[{tmp_path}]"]
    run_py([*job, *off, "nccl=tuned", f"hydra.run.dir={tmp_path / 'tuned'}"], env=SHELL)
    p = run_py([*job, *off, "nccl=default", f"hydra.run.dir={tmp_path / 'default'}"], env=SHELL)
    base = results.read(tmp_path / "default" / "baseline")
    assert base.role == "baseline" and base.drift is not None and base.drift.earlier_runs == 1
    assert base.drift.env_differences[0] == PROFILE and LOST in base.drift.env_differences
    assert base.drift.message in base.warnings
    assert any(LOST in line for line in drift_lines(p.stderr)), p.stderr[-3000:]


def test_a_sweep_over_nccl_compares_each_profile_with_its_own_history(tmp_path):
    """The sweep asks what NCCL changes: another profile in it is the question, not drift."""
    sweep = tmp_path / "sweep"
    run_py(
        [
            "-m",
            "drafter=none",
            "nccl=tuned,default",
            *small("benchmark.profile=false"),
            "tracking=off",
            f"tracking.results_dirs=[{tmp_path}]",
            f"hydra.sweep.dir={sweep}",
        ],
        env=SHELL,
    )
    default = next(r for r in results.collect(sweep) if r.choice("nccl") == "default")
    assert default.drift is None and not drift_lines("\n".join(default.warnings))
