"""An experiment that records its machine starts (experiments/<name>/starts.json, `starts NAME SWEEP
--record`): `starts NAME` shows them, and `compare` judges a rebuild by each cell's next-start interval
instead of one start's launch-only rerun interval. Real files in a real git repository (the record refuses
paths git ignores); the H100 8B cell's six committed starts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from spec_decode import bench
from spec_decode.views import experiment
from spec_decode.views import starts as starts_view

ROOT = Path(__file__).resolve().parents[2]
EXP = "real_shape_h100x1"
STARTS = [  # starts 2-6 of the committed experiment (start 1: its metrics.json)
    "docs/data/real_shape_h100x1_2026-12-06_s8_rebuild_metrics.json",  # 1.770: outside the rerun interval
    "docs/data/real_shape_h100x1_2026-12-06_s9_start3_metrics.json",  # 1.781
    "docs/data/real_shape_h100x1_2026-12-06_s10_start4_metrics.json",  # 1.776: outside, but inside 3 starts'
    "docs/data/real_shape_h100x1_2026-12-06_s10_start5_metrics.json",  # 1.768: inside 4 starts' [1.755, 1.801]
    "docs/data/real_shape_h100x1_2026-12-06_s11_start6_metrics.json",  # 1.780: inside 5 starts' [1.755, 1.797]
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
    assert code == 0 and "[1.741, 1.817]" in out
    assert out.startswith(f"recorded: experiments/{EXP}/starts.json (3 starts with its metrics.json)\nnext: dvc repro")
    assert f"note: commit the recorded files with experiments/{EXP}/starts.json (git add {' '.join(STARTS[:2])})" in out
    assert f"next: dvc repro report@{EXP}" in out
    assert json.loads((repo / f"experiments/{EXP}/starts.json").read_text())["starts"] == STARTS[:2]

    code, out, _ = run(capsys, "compare", EXP, STARTS[2])
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "(next start 1.741-1.817)" in row and row.rstrip().endswith("agree") and "rerun" not in row
    assert "1 of 1 speedups of " + STARTS[2] + " inside real_shape_h100x1's 95% next-start interval" in out
    assert f"next-start intervals: from 3 machine starts, experiments/{EXP}/metrics.json's record" in out
    assert "verdict: agree: all 1 spec cell(s) agree: inside the next-start interval" in out
    assert "outside the" not in out

    code, out, _ = run(capsys, "starts", EXP)  # the record alone: three starts
    assert code == 0 and "start 3: " + STARTS[1] in out and "start 4" not in out


def test_the_sixth_start_lands_in_the_interval_the_committed_facts_gave(repo, capsys):
    """Pre-registered in the README facts: five starts put the next one in [1.755, 1.797]; the sixth (a fresh
    H100, 2026-12-06 09:43) came in at 1.780."""
    run(capsys, "starts", EXP, *STARTS[:4], "--record")
    code, out, _ = run(capsys, "compare", EXP, STARTS[4])
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert code == 0 and "(next start 1.755-1.797)" in row and "1.780 [1.776, 1.784]" in row, out


def test_starts_name_shows_the_committed_record(capsys, monkeypatch):
    """The repository's own record: six H100 starts, a start effect shown, and a next-start interval that
    holds every start. The experiment's metrics.json named as a file is that file alone."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    code, out, _ = run(capsys, "starts", EXP)
    assert code == 0
    assert [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("start ")][1:] == STARTS
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "1.785      1.770      1.781      1.776      1.768      1.780" in row
    assert "shown (F=11.6, df 5,12, p<0.001; Welch p=0.0057)" in row and "[1.759, 1.795]" in row
    for again in (str(ROOT / STARTS[0]), f"experiments/{EXP}", EXP, f"experiments/{EXP}/metrics.json"):
        assert run(capsys, "starts", EXP, again)[1] == out, again  # a start given again is shown once
    code, out, _ = run(capsys, "starts", f"experiments/{EXP}/metrics.json", STARTS[0])
    assert code == 0 and "start 3" not in out  # a metrics.json path: that file, no record


def scaled(src: Path, dst: Path, by: float) -> str:
    """A copy of a metrics.json whose speedups (cells and jobs) are ``by`` times the source's, and every job's
    tok/s too (another measurement: a copy with the source's tok/s is the source given twice)."""
    m = json.loads(src.read_text())
    keys = {"speedup_vs_baseline", "speedup_vs_baseline_ci95_lo", "speedup_vs_baseline_ci95_hi", "throughput_tok_s"}
    for entry in [*m["cells"].values(), *m["jobs"].values()]:
        for k in keys & set(entry):
            entry[k] *= by
    dst.write_text(json.dumps(m))
    return dst.name


def test_a_recorded_start_given_as_b_is_left_out_and_a_far_one_differs(repo, capsys):
    run(capsys, "starts", EXP, *STARTS[:3], "--record")
    code, out, _ = run(capsys, "compare", EXP, STARTS[2])  # the fourth start, recorded: judged by starts 1-3
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "(next start 1.741-1.817)" in row and row.rstrip().endswith("agree") and code == 0
    assert "note: " + STARTS[2] + " holds the same jobs as recorded start 4" in out
    assert "from 3 machine starts" in out
    copy = json.loads((repo / STARTS[2]).read_text())  # the same start re-exported (a key more): left out too
    for job in copy["jobs"].values():
        job["new_field_from_a_newer_writer"] = None
    (repo / "copy.json").write_text(json.dumps(copy))
    code, out, _ = run(capsys, "compare", EXP, "copy.json")
    assert "note: copy.json holds the same jobs as recorded start 4" in out and "(next start 1.741-1.817)" in out
    far = scaled(repo / STARTS[2], repo / "far.json", 0.97)  # a fifth start 3% slower: past any start seen
    code, out, _ = run(capsys, "compare", EXP, far)
    assert code == 1 and "DIFFERS: outside the next-start interval (-3.5%)" in out
    assert "outside the next-start interval: spec.steps=1. Launch noise and a start's shift" in out
    assert "record it all the same" in out
    assert "0 of 1 speedups of far.json inside" in out and "holds the same jobs" not in out


def test_the_interval_is_never_narrower_than_the_rerun_interval(repo, capsys):
    """Three starts that agree to 0.01% (as real_shape_h200x1's two did) would give an interval narrower than
    one start's launch noise; a rebuild inside the rerun interval is not called a difference."""
    m = repo / f"experiments/{EXP}/metrics.json"
    close = [scaled(m, repo / f"docs/data/close{i}.json", by) for i, by in enumerate((1.0001, 0.9999))]
    run(capsys, "starts", EXP, *(f"docs/data/{c}" for c in close), "--record")
    b = scaled(m, repo / "b.json", 0.997)  # 1.779: inside the rerun interval 1.777-1.793
    code, out, _ = run(capsys, "compare", EXP, b)
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert "(next start 1.777-1.793)" in row and row.rstrip().endswith("agree") and code == 0, out


def test_a_record_that_is_not_one_design_with_a_is_not_used(repo, capsys):
    """compare --rev at another design, or a re-measured metrics.json: the record is checked again."""
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    shutil.copy(ROOT / "experiments/real_shape_h200x1/metrics.json", repo / "h200.json")
    h200 = json.loads((repo / "h200.json").read_text())
    b = json.loads((repo / scaled(repo / "h200.json", repo / "h200b.json", 1.001)).read_text())
    got, notes, _ = starts_view.for_compare(EXP, h200, b, repo)
    assert got == {} and notes[0].startswith(f"warning: the record of experiments/{EXP}/metrics.json is not one")
    assert "in hardware 'h200x1' vs 'h100x1'" in notes[0] and notes[0].endswith("judged by the rerun interval")


def test_a_b_of_another_design_is_not_judged_by_the_record(repo, capsys):
    """Another card's result is no start of the experiment: the record does not apply, and compare does not
    ask to record it."""
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    shutil.copy(ROOT / "experiments/real_shape_h200x1/metrics.json", repo / "h200.json")
    code, out, _ = run(capsys, "compare", EXP, "h200.json")
    assert code == 1 and "(rerun 1.777-1.793)" in out and "next start" not in out
    assert f"note: h200.json is not one design with experiments/{EXP}/metrics.json (cell 'spec.steps=1' differs" in out
    assert "not a start of it, so its record does not apply" in out and "record it all the same" not in out
    assert "measure more starts" not in out  # the rerun interval's hint is about starts of one design


def test_what_is_not_a_metrics_json_is_named_not_a_traceback(repo, capsys):
    shutil.copy(ROOT / "experiments/real_shape_h200x1/summary.json", repo / "summary.json")
    (repo / "notes.json").write_text("{ not json")
    for argv in (["compare", EXP, "summary.json"], ["starts", EXP, "summary.json"], ["compare", EXP, "notes.json"]):
        code, _, err = run(capsys, *argv)  # an input error: exit 2, the message on stderr
        assert code == 2 and (
            "error: sweep: summary.json is not a metrics.json (no 'jobs'" in err
            or "error: sweep: notes.json cannot be read as JSON" in err
        ), (argv, code, err)


def test_every_reported_experiment_has_a_record_its_report_stage_depends_on():
    """dvc.yaml's report stages depend on experiments/<item>/starts.json: a missing one fails `dvc repro`."""
    import yaml

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]
    assert "experiments/${item}/starts.json" in stage["do"]["deps"]
    for item in stage["foreach"]:
        exp = ROOT / "experiments" / item
        assert isinstance(starts_view.recorded(exp, ROOT), list), item  # present, valid, files unchanged
        assert (exp / "starts.json").is_file(), item


def test_rebuild_checks_the_record_before_it_runs_the_sweep(repo, capsys):
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    (repo / STARTS[1]).unlink()
    with pytest.raises(SystemExit) as e:
        bench.rebuild(EXP, repo, [])
    assert f"recorded start {STARTS[1]} not found" in str(e.value.code)
    assert not (repo / f"experiments/{EXP}/rebuild").exists()


def test_record_refuses_what_is_not_a_kept_start_of_the_design(repo, capsys, tmp_path_factory):
    record = repo / f"experiments/{EXP}/starts.json"
    (repo / "multirun").mkdir()
    shutil.copy(repo / STARTS[0], repo / "multirun/m.json")
    outside = tmp_path_factory.mktemp("elsewhere") / "m.json"
    shutil.copy(repo / STARTS[0], outside)
    h200 = repo / "docs/data/h200.json"
    shutil.copy(ROOT / "experiments/real_shape_h200x1/metrics.json", h200)
    fewer = json.loads((repo / STARTS[0]).read_text())  # a start whose spec cell lost a block's jobs
    fewer["jobs"] = {k: v for k, v in fewer["jobs"].items() if not ("block=2" in k and "steps" in k)}
    (repo / "docs/data/fewer.json").write_text(json.dumps(fewer))
    cheap = json.loads((repo / STARTS[0]).read_text())  # cheap mode: no block-design cells
    cheap["jobs"] = {k: v for k, v in cheap["jobs"].items() if "block=0" in k}
    del cheap["cells"]
    (repo / "docs/data/cheap.json").write_text(json.dumps(cheap))
    shutil.copy(ROOT / "experiments/real_shape_h200x1/summary.json", repo / "docs/data/summary.json")
    again = json.loads((repo / f"experiments/{EXP}/metrics.json").read_text())  # start 1 re-exported: a key more,
    for job in again["jobs"].values():  # its runs' dirs renamed
        job["new_field_from_a_newer_writer"], job["out_dir"] = None, "elsewhere/" + job["out_dir"]
    (repo / "docs/data/again.json").write_text(json.dumps(again))
    (repo / "docs/data/empty.json").write_text(json.dumps({"jobs": {}}))
    cases = [
        (["docs/data/again.json"], "shares 6 of 6 jobs' measurements with experiments/real_shape_h100x1/metrics.json"),
        (["docs/data/empty.json"], "has no jobs (an empty sweep)"),
        (["docs/data/fewer.json"], "cell 'spec.steps=1' has 2 blocks, experiments/real_shape_h100x1/metrics.json 3"),
        (["docs/data/cheap.json"], "has no block values (a cheap-mode sweep)"),
        (["docs/data/summary.json"], "is not a metrics.json (no 'jobs'; summary.json is not one"),
        (["docs/data/nothing.json"], "docs/data/nothing.json not found"),
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
    code, _, err = run(capsys, "starts", EXP, STARTS[0], "--record")
    assert "is already recorded" in str(code) + err
    code, _, err = run(capsys, "starts", "docs/data/h200.json", STARTS[1], "--record")
    assert code == 2 and "is not a reported experiment" in err
    assert json.loads(record.read_text())["starts"] == STARTS[:1]


def test_a_missing_recorded_start_or_a_broken_record_is_named(repo, capsys):
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    (repo / STARTS[1]).unlink()
    for argv in (["starts", EXP], ["compare", EXP, STARTS[0]]):
        code, _, err = run(capsys, *argv)
        assert f"recorded start {STARTS[1]} not found" in str(code) + err, argv
    f = repo / f"experiments/{EXP}/starts.json"
    (repo / STARTS[1]).write_bytes((ROOT / STARTS[1]).read_bytes())
    assert run(capsys, "starts", EXP)[0] == 0
    (repo / STARTS[1]).write_text((repo / STARTS[1]).read_text().replace("1.77", "1.71", 1))  # changed after recording
    for argv in (["starts", EXP], ["compare", EXP, STARTS[0]], ["report", EXP]):
        code, _, err = run(capsys, *argv)
        assert f"recorded start {STARTS[1]} is not the file that was recorded" in str(code) + err, argv
    for text, why in (("[]", 'needs {"starts": [metrics.json paths'), ("{", "not JSON")):
        f.write_text(text)
        code, _, err = run(capsys, "starts", EXP)  # an input error: exit 2, the message on stderr
        assert code == 2 and f"error: {f}: " in err and why in err, text


def test_two_recorded_starts_give_no_interval_and_compare_says_so(repo, capsys):
    run(capsys, "starts", EXP, STARTS[0], "--record")
    code, out, _ = run(capsys, "compare", EXP, STARTS[1])
    assert "next-start intervals: none (2 starts; 3 are needed): judged by the rerun interval" in out
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


def test_the_report_facts_carry_the_record(repo, capsys):
    """The README facts (the DVC report stage): nothing without a record, the count with too few starts, and
    from 3 starts the interval compare judges by, widened to the rerun interval where that is wider."""
    exp = repo / f"experiments/{EXP}"
    metrics = json.loads((exp / "metrics.json").read_text())
    assert starts_view.facts(exp, metrics, repo) == []
    run(capsys, "starts", EXP, STARTS[0], "--record")
    assert starts_view.facts(exp, metrics, repo) == [
        "- machine starts: 2 (this metrics.json and starts.json); 3 give a next-start interval"
    ]
    run(capsys, "starts", EXP, STARTS[1], "--record")
    (line,) = starts_view.facts(exp, metrics, repo)
    assert line.startswith("- next-start interval (95%: where a rebuild on another machine start lands, from 3")
    assert line.endswith(": [1.741, 1.817] at spec.steps=1")
    close = [
        scaled(exp / "metrics.json", repo / f"docs/data/close{i}.json", by) for i, by in enumerate((1.0001, 0.9999))
    ]
    (exp / "starts.json").unlink()
    run(capsys, "starts", EXP, *(f"docs/data/{c}" for c in close), "--record")
    assert starts_view.facts(exp, metrics, repo)[0].endswith(": [1.777, 1.793] at spec.steps=1")  # the rerun interval
    h200 = json.loads((ROOT / "experiments/real_shape_h200x1/metrics.json").read_text())  # a re-measured metrics.json
    assert "starts.json is not one design with this metrics.json" in starts_view.facts(exp, h200, repo)[0]


def test_the_report_stage_writes_the_record_into_the_readme_facts(repo, capsys):
    shutil.copy(ROOT / f"experiments/{EXP}/README.md", repo / f"experiments/{EXP}/README.md")
    run(capsys, "starts", EXP, *STARTS[:2], "--record")
    assert run(capsys, "report", EXP)[0] == 0
    body = (repo / f"experiments/{EXP}/README.md").read_text()
    facts = body[body.index("<!-- facts:begin") : body.index("<!-- facts:end")]
    assert "from 3 starts: this metrics.json and starts.json; `compare` judges by it): [1.741, 1.817]" in facts


def test_what_a_first_user_gets_wrong_is_named(repo, capsys, monkeypatch):
    """A path that is not there, NAME given as experiments/NAME, --rev beside a sweep, an experiment that
    records no start, another design given to starts, a start from an uncommitted tree, another directory."""
    for argv in (["compare", EXP, "docs/data/nope.json"], ["starts", EXP, "docs/data/nope.json"]):
        code, _, err = run(capsys, *argv)  # an input error (2), not an MLflow error
        assert code == 2 and "docs/data/nope.json: no such file or directory" in err, argv
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    code, out, err = run(capsys, "compare", f"experiments/{EXP}")
    assert code == 0 and "nothing was rebuilt" in err and "verdict: agree" in out
    code, _, err = run(capsys, "compare", EXP, STARTS[0], "--rev", "HEAD")
    assert code == 2 and "compare --rev applies to compare NAME alone" in err
    code, out, _ = run(capsys, "compare", EXP, STARTS[0])
    assert f"next-start intervals: none (experiments/{EXP}/metrics.json records no other start" in out
    shutil.copy(ROOT / "experiments/real_shape_h200x1/metrics.json", repo / "h200.json")
    code, out, _ = run(capsys, "starts", EXP, *STARTS[:2], "h200.json")
    row = next(line for line in out.splitlines() if line.startswith("spec.steps=1"))
    assert code == 0 and "[" not in row and "shown" not in row  # the values, no test and no interval
    assert out.rstrip().endswith(
        "4 sweeps that are not one design (the warnings above): no start-effect test, no next-start interval"
    )
    code, out, _ = run(capsys, "starts", EXP, *STARTS[1:3])
    note = next(line for line in out.splitlines() if "uncommitted changes" in line)
    assert note.startswith(f"note: experiments/{EXP}/metrics.json: measured from a tree")  # starts 3, 4: clean
    monkeypatch.chdir(repo / "docs")
    monkeypatch.delenv("DVC_ROOT")
    code, _, err = run(capsys, "starts", EXP)
    assert code == 2 and f"no experiments/{EXP} with a metrics.json under {repo / 'docs'}" in err
    monkeypatch.chdir(repo)
    code, _, err = run(capsys, "starts", f"experiments/{EXP}/metrics.json")
    assert code == 2 and "is one sweep: a metrics.json path is that file alone" in err


def test_a_b_in_fewer_blocks_or_sharing_a_start_is_named(repo, capsys):
    """With a record: a B measured in fewer blocks is no start of the design (judged by the rerun interval,
    the reason said); a B that shares part of a recorded start's measurement is left out of it, the share
    said. Without one: an axis B's older writer did not record is no other design."""
    old = json.loads((repo / STARTS[0]).read_text())
    for e in [*old["cells"].values(), *old["jobs"].values()]:
        (e.get("axes") or {}).pop("benchmark.concurrency", None)
    (repo / "old.json").write_text(json.dumps(old))
    code, out, _ = run(capsys, "compare", EXP, "old.json")
    assert "not one design" not in out and "records no other start" in out
    run(capsys, "starts", EXP, *STARTS[:3], "--record")
    cut = json.loads((repo / STARTS[3]).read_text())  # start 5 in 2 of its 3 blocks
    cut["jobs"] = {k: v for k, v in cut["jobs"].items() if "block=2" not in k}
    (repo / "cut.json").write_text(json.dumps(cut))
    code, out, _ = run(capsys, "compare", EXP, "cut.json")
    assert "has 2 blocks" in out and "not a start of it, so its record does not apply" in out
    assert "next start" not in out and "(rerun 1.777-1.793)" in out
    part = json.loads((repo / STARTS[2]).read_text())  # start 4's block 0 and 1, a new block 2
    for k, v in part["jobs"].items():
        if "block=2" in k:
            v["throughput_tok_s"] *= 1.001
    (repo / "part.json").write_text(json.dumps(part))
    code, out, _ = run(capsys, "compare", EXP, "part.json")
    assert "note: part.json shares 4 of 6 jobs' measurements with recorded start 4" in out
    assert "from 3 machine starts" in out  # starts 1-3: start 4 left out
