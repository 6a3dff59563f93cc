"""An experiment that records its machine starts (experiments/<name>/starts.json, `starts NAME SWEEP
--record`): `starts NAME` shows them, and `compare` judges a rebuild by each cell's next-start interval
instead of one start's launch-only rerun interval. Real files in a real git repository (the record refuses
paths git ignores); the H100 8B cell's four committed starts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from spec_decode.views import experiment

ROOT = Path(__file__).resolve().parents[2]
EXP = "real_shape_h100x1"
STARTS = [  # starts 2-4 of the committed experiment (start 1: its metrics.json)
    "docs/data/real_shape_h100x1_2026-12-06_s8_rebuild_metrics.json",  # 1.770: outside the rerun interval
    "docs/data/real_shape_h100x1_2026-12-06_s9_start3_metrics.json",  # 1.781
    "docs/data/real_shape_h100x1_2026-12-06_s10_start4_metrics.json",  # 1.776: outside, but inside 3 starts'
]


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A git repository holding the experiment (its metrics.json, no starts recorded) and the starts' files."""
    for rel in [f"conf/experiment/{EXP}.yaml", f"experiments/{EXP}/metrics.json", *STARTS]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / ".gitignore").write_text("multirun/\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        experiment.main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    got = capsys.readouterr()
    return code, got.out, got.err


def test_record_then_compare_judges_the_fourth_start_by_the_first_three(repo, capsys):
    """Pre-registered: three starts put the next one in [1.741, 1.817]; the fourth came in at 1.776. Launch
    noise alone (the rerun interval, the CIs) calls it a difference."""
    code, out, _ = run(capsys, "compare", EXP, STARTS[2])
    assert code == 1 and "DIFFERS: speedup intervals disjoint (-0.5%)" in out
    assert "(rerun 1.777-1.793)" in out and "0 of 1 speedups of" in out
    assert "outside the rerun interval: spec.steps=1" in out

    code, out, _ = run(capsys, "starts", EXP, *STARTS[:2], "--record")
    assert code == 0 and "recorded: " in out and "[1.741, 1.817]" in out
    assert json.loads((repo / f"experiments/{EXP}/starts.json").read_text())["starts"] == STARTS[:2]

    code, out, _ = run(capsys, "compare", EXP, STARTS[2])
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "(next start 1.741-1.817)" in row and row.rstrip().endswith("agree") and "rerun" not in row
    assert "1 of 1 speedups of " + STARTS[2] + " inside real_shape_h100x1's 95% next-start interval" in out
    assert f"next-start intervals: from 3 recorded machine starts of experiments/{EXP}/metrics.json" in out
    assert "verdict: agree" in out and "outside the" not in out

    code, out, _ = run(capsys, "starts", EXP)  # the record alone: three starts
    assert code == 0 and "start 3: " + STARTS[1] in out and "start 4" not in out


def test_starts_name_shows_the_committed_record(capsys, monkeypatch):
    """The repository's own record: four H100 starts, a start effect that survives a Bonferroni correction
    for the 21 GPU cells tested (0.0024), and a next-start interval that holds every start."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    code, out, _ = run(capsys, "starts", EXP)
    assert code == 0
    assert [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("start ")][1:] == STARTS
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "1.785      1.770      1.781      1.776" in row
    assert "shown (F=15.4, df 3,8, p=0.0011; Welch p=0.0066)" in row and "[1.755, 1.801]" in row
    # a recorded start given again is shown once
    code, again, _ = run(capsys, "starts", EXP, str(ROOT / STARTS[0]))
    assert again == out


def test_compare_warns_when_b_is_a_recorded_start_and_flags_a_far_one(repo, capsys):
    run(capsys, "starts", EXP, *STARTS, "--record")
    code, out, _ = run(capsys, "compare", EXP, STARTS[0])
    assert "warning: " + STARTS[0] + " holds the same jobs as recorded start 2" in out
    far = json.loads((repo / STARTS[2]).read_text())  # a fifth start 3% slower: past any start seen
    for entry in [*far["cells"].values(), *far["jobs"].values()]:
        for k in {"speedup_vs_baseline", "speedup_vs_baseline_ci95_lo", "speedup_vs_baseline_ci95_hi"} & set(entry):
            entry[k] *= 0.97
    (repo / "far.json").write_text(json.dumps(far))
    code, out, _ = run(capsys, "compare", EXP, "far.json")
    assert code == 1 and "DIFFERS: outside the next-start interval (-3.5%)" in out
    assert "outside the next-start interval: spec.steps=1. Launch noise and a start's shift" in out
    assert "0 of 1 speedups of far.json inside" in out and "holds the same jobs" not in out


def test_record_refuses_what_is_not_a_kept_start_of_the_design(repo, capsys, tmp_path_factory):
    record = repo / f"experiments/{EXP}/starts.json"
    (repo / "multirun").mkdir()
    shutil.copy(repo / STARTS[0], repo / "multirun/m.json")
    outside = tmp_path_factory.mktemp("elsewhere") / "m.json"
    shutil.copy(repo / STARTS[0], outside)
    h200 = repo / "docs/data/h200.json"
    shutil.copy(ROOT / "experiments/real_shape_h200x1/metrics.json", h200)
    cases = [
        (["multirun/m.json"], "multirun/m.json is ignored by git"),
        ([str(outside)], "is outside the repository"),
        ([f"experiments/{EXP}"], "is not a metrics.json file"),
        ([f"experiments/{EXP}/metrics.json"], "one measurement given twice, not two starts"),
        (["docs/data/h200.json"], "in hardware 'h100x1' vs 'h200x1': not one design"),
    ]
    for argv, why in cases:
        code, _, err = run(capsys, "starts", EXP, *argv, "--record")
        assert code not in (0, None) and why in str(code) + err, (argv, code, err)
        assert not record.exists(), argv  # nothing recorded
    run(capsys, "starts", EXP, STARTS[0], "--record")
    code, _, _ = run(capsys, "starts", EXP, STARTS[0], "--record")
    assert "is already recorded" in str(code)
    code, _, err = run(capsys, "starts", "docs/data/h200.json", STARTS[1], "--record")
    assert code == 2 and "is not a reported experiment" in err
    assert json.loads(record.read_text())["starts"] == STARTS[:1]


def test_a_missing_recorded_start_is_named(repo, capsys):
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    (repo / STARTS[1]).unlink()
    for argv in (["starts", EXP], ["compare", EXP, STARTS[0]]):
        code, _, _ = run(capsys, *argv)
        assert f"recorded start {STARTS[1]} not found" in str(code), argv


def test_two_recorded_starts_give_no_interval_and_compare_says_so(repo, capsys):
    run(capsys, "starts", EXP, STARTS[0], "--record")
    code, out, _ = run(capsys, "compare", EXP, STARTS[1])
    assert "next-start intervals: none (2 recorded starts; 3 are needed): judged by the rerun interval" in out
    assert "(rerun 1.777-1.793)" in out and code == 0  # 1.781: inside the rerun interval
    code, out, err = run(capsys, "starts", "real_shape_h100x1_typo")
    assert code == 2 and "two or more sweeps" in err


def test_compare_name_takes_start_1_from_the_revision_compared(repo, capsys):
    """`compare NAME`: the reported metrics.json at --rev is start 1 of the record, not the rebuilt workspace."""
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "reported"], cwd=repo, check=True)
    rebuilt = json.loads((repo / f"experiments/{EXP}/metrics.json").read_text())
    for entry in [*rebuilt["cells"].values(), *rebuilt["jobs"].values()]:  # a rebuild 1% slower
        for k in {"speedup_vs_baseline", "speedup_vs_baseline_ci95_lo", "speedup_vs_baseline_ci95_hi"} & set(entry):
            entry[k] *= 0.99
    (repo / f"experiments/{EXP}/metrics.json").write_text(json.dumps(rebuilt))
    code, out, _ = run(capsys, "compare", EXP)
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "1.785 [1.779, 1.791] (next start 1.741-1.817)" in row and "1.767" in row and code == 0, out
