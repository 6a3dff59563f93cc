"""Issue 29 must-show: the README's quick start, DVC and GPU-dry-run commands run as written in a fresh
clone (`git clone` of HEAD: what is committed). The cheap tier runs here: `dvc status` clean, `dvc repro`
would run nothing (--dry), the dry runs, the DVC remote bookkeeping on stand-ins, the doctor's
--static-only form, the GPU sweep refused in preflight; expensive commands run in their cheap form
(--dry, --help, --collect-only). Jobs and sweeps: `python benchmarks/readme_commands.py [--sweeps]`."""

import subprocess
import sys

import pytest

from ..conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_commands as rc  # noqa: E402
from readme_extract import Command  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    return rc.Clone(ROOT, tmp_path_factory.mktemp("readme"), install=False)


def test_the_cheap_readme_commands_run_as_written_in_a_fresh_clone(clone):
    rows = rc.run_all(clone, {"test"}, log=None)
    failed = [f"{r.ran_as} (exit {r.rc}): {r.check}\n{r.output[-1500:]}" for r in rows if r.status == "FAIL"]
    assert not failed, "\n\n".join(failed)
    ran = {r.ran_as: r for r in rows if r.status == "pass"}
    assert {"dvc status", "dvc repro --dry", "dvc metrics diff", "dvc dag"} <= set(ran), sorted(ran)
    assert "Data and pipelines are up to date" in ran["dvc status"].output
    assert "Running stage" not in ran["dvc repro --dry"].output
    refusals = set() if clone.gpu_box else {"gpu-sweep", "doctor-gpu"}  # what a box without GPU/sglang says
    assert {r.kind for r in rows if r.status == "pass"} >= {
        "dry-run",
        "dvc-write",
        "experiment-view",
        "repro-experiment",
        "suite",
    } | refusals
    # every row not run says which tier runs it, or the rule that keeps it off this machine
    # (on a GPU box the gpu-* rows are left to be run as written)
    gpu_rows = {"gpu-sweep", "doctor-gpu"} if clone.gpu_box else set()
    assert all(r.tier in rc.TIERS[1:] for r in rows if r.status == "skip" and r.kind not in gpu_rows)
    assert all(r.check for r in rows if r.status == "never")


@pytest.mark.parametrize(
    "typo",
    [
        "python run.py -m experiment=embeded_steps_nccl dry_run=true",
        "dvc repro -s -f bench@embedded_steps_ncl report@embedded_steps_nccl",
        "python -m spec_decode.views.experiment headline embedded_step_nccl",
    ],
)
def test_a_typo_in_a_readme_command_fails(clone, typo):
    cmd = Command("DVC: models, data and reported results", 0, typo)
    row = rc.run_one(cmd, rc.classify(cmd), {"test"}, clone)
    assert row.status == "FAIL" and row.rc not in (None, 0), (row.check, row.output[-800:])
