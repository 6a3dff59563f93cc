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
    # the experiment READMEs' `dvc repro X@Y` lines: checked together in dry DVC runs (run_dry_repros), each
    # line's stages in the run that stands for it
    stages = [r for r in rows if r.kind == "repro-stages"]
    assert len(stages) >= 3 and len({r.ran_as for r in stages}) < len(stages), [r.ran_as for r in stages]
    assert all(f" {r.cmd.text[len('dvc repro ') :]} " in r.ran_as for r in stages), [r.ran_as for r in stages]
    refusals = set() if clone.gpu_box else {"gpu-sweep", "doctor-gpu"}  # what a box without GPU/sglang says
    assert {r.kind for r in rows if r.status == "pass"} >= {
        "dry-run",
        "dvc-write",
        "experiment-view",
        "repro-experiment",
        "suite",
        "repro-stages",  # issue 44: an experiment README's `dvc repro X@Y`: nothing runs in a fresh clone
        "experiment-rebuild",  # its rerun (--help here; the job tier runs ci_smoke's)
        "gpu-sweep-dir",
        "git-read",
    } | refusals
    # issue 44: the experiment READMEs' commands are run too, each README's
    sections = {r.cmd.section for r in rows if r.status in ("pass", "never")}
    assert {
        f"experiments/{n}/README.md" for n in ("ci_smoke", "embedded_steps_nccl", "kimi_k25_rtx6000x8_eagle3")
    } <= sections
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


def test_a_typo_among_repro_lines_checked_together_fails_alone(clone):
    """The dry `dvc repro` lines between two commands that may change what DVC sees run as one DVC process
    (run_dry_repros; the main test's pass as one); when it does not pass, each line runs alone for its own
    verdict: the typo fails, the good line passes."""
    good, typo = "dvc repro bench@ci_smoke report@ci_smoke", "dvc repro report@ci_smok"
    rows = rc.run_commands(
        [Command("DVC: models, data and reported results", n, t) for n, t in enumerate((good, typo))], {"test"}, clone
    )
    assert [r.status for r in rows] == ["pass", "FAIL"], [(r.ran_as, r.check, r.output[-400:]) for r in rows]
    assert [r.ran_as for r in rows] == [f"{good} --dry", f"{typo} --dry"] and rows[1].rc not in (None, 0), rows[
        1
    ].output[-800:]


def test_a_readme_command_that_changes_what_git_tracks_fails(clone):
    """Issue 44: after a command, git must be as it was (a fresh clone stays one), unless the command's rule
    says it writes committed files. Here the report of a committed experiment whose metrics.json was edited
    (in the clone) re-renders its table, plots and README: files git tracks, changed by the command."""
    metrics = clone.dir / "experiments/ci_smoke/metrics.json"
    metrics.write_text(metrics.read_text().replace('"status": "FINISHED"', '"status": "FAILED"', 1))
    try:
        cmd = Command("experiments/ci_smoke/README.md", 0, "python -m spec_decode.views.experiment report ci_smoke")
        row = rc.run_one(cmd, rc.classify(cmd), {"test"}, clone)
        assert row.status == "FAIL" and row.check.startswith("changed what git tracks: "), (
            row.check,
            row.output[-800:],
        )
        assert "experiments/ci_smoke/table.txt" in row.check and "metrics.json" not in row.check  # the command's doing
    finally:
        subprocess.run(["git", "checkout", "HEAD", "--", "experiments/ci_smoke"], cwd=clone.dir, check=True)
