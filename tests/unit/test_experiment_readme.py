"""What the README and compare say about a reported experiment comes from its metrics.json: the headline
table is generated from it; compare warns when the workspace metrics are the committed ones."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spec_decode.views import experiment
from spec_decode.views.compare import bench_hint, same_metrics_warning
from spec_decode.views.experiment import headline, protocol

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PROTO = "5 runs x 500 greedy tokens per job, 1 warmup"

METRICS = {
    "git_commit": "0123456789abcdef",
    "git_dirty": False,
    "jobs": {
        "baseline,nccl=default": {
            "index": 0,
            "status": "FINISHED",
            "role": "baseline",
            "engine": "embedded",
            "axes": {"nccl": "default", "spec.steps": None},
            "throughput_tok_s": 300.0,
            "throughput_tok_s_ci95_lo": 290.0,
            "throughput_tok_s_ci95_hi": 310.0,
            "checks": {},
        },
        "nccl=default,spec.steps=3": {
            "index": 1,
            "status": "FINISHED",
            "role": "spec",
            "engine": "embedded",
            "axes": {"nccl": "default", "spec.steps": 3},
            "throughput_tok_s": 450.0,
            "throughput_tok_s_ci95_lo": 440.0,
            "throughput_tok_s_ci95_hi": 460.0,
            "speedup_vs_baseline": 1.5,
            "speedup_vs_baseline_ci95_lo": 1.47,
            "speedup_vs_baseline_ci95_hi": 1.53,
            "speedup_method": "paired",
            "accept_len": 3.62,
            "accept_rate_draft": 0.88,
            "cycle_ms": 8.0,
            "draft_ms": 1.5,
            "verify_ms": 5.0,
            "extend_ms": 1.4,
            "checks": {},
        },
        "nccl=default,spec.steps=5": {
            "index": 2,
            "status": "FAILED",
            "role": "spec",
            "engine": "embedded",
            "axes": {"nccl": "default", "spec.steps": 5},
            "checks": {},
        },
    },
}


def test_headline_table_is_generated_from_metrics_json():
    text = headline(METRICS, "embedded_steps_nccl", PROTO)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| baseline | default | 300 [290, 310]   | -                           | -            | -                   "
        "| -          | -                               | ok       |",
        "| steps=3  | default | 450 [440, 460]   | 1.50x [1.47, 1.53] (paired) | 3.62         | 0.88                "
        "| 8.00       | 1.50 / 5.00 / 1.40              | ok       |",
    ]  # the FAILED job has no numbers to show
    assert "python run.py -m experiment=embedded_steps_nccl" in text and "0123456789" in text


def test_headline_replaces_its_block_and_nothing_else(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "experiments" / "ci_smoke").mkdir(parents=True)
    (tmp_path / "experiments" / "ci_smoke" / "metrics.json").write_text(json.dumps(METRICS))
    readme = tmp_path / "README.md"
    begin, end = experiment.HEADLINE_BEGIN.format(name="ci_smoke"), experiment.HEADLINE_END
    readme.write_text(f"# title\n\n{begin}\nold table\n{end}\n\nafter\n")
    experiment.write_headline("ci_smoke", tmp_path, readme)
    body = readme.read_text()
    assert "old table" not in body and "1.50x [1.47, 1.53] (paired)" in body
    assert "(3 runs x 64 greedy tokens per job, 1 warmup;" in body  # ci_smoke's protocol, not the default's
    assert body.startswith("# title\n\n") and body.endswith(f"{end}\n\nafter\n")
    experiment.write_headline("ci_smoke", tmp_path, readme)
    assert readme.read_text() == body  # idempotent
    other = tmp_path / "OTHER.md"  # no markers for this experiment: refused, the file untouched
    other.write_text(f"# other\n\n{experiment.HEADLINE_BEGIN.format(name='embedded_steps_nccl')}\nx\n{end}\n")
    before = other.read_text()
    with pytest.raises(SystemExit, match=r"OTHER.md has no headline block for ci_smoke"):
        experiment.write_headline("ci_smoke", tmp_path, other)
    assert other.read_text() == before


def test_headline_names_the_machine_its_numbers_came_from():
    assert "; machine not recorded;" in headline(METRICS, "x", PROTO)
    host = {"cpu_model": "AMD EPYC", "usable_cores": 2, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 2}
    assert "; measured on AMD EPYC, 2 cores, 2 x NVIDIA H100 80GB HBM3;" in headline(
        {**METRICS, "host": host}, "x", PROTO
    )


def test_protocol_is_the_experiments_own_and_the_records_counts():
    assert protocol("ci_smoke", ROOT) == "3 runs x 64 greedy tokens per job, 1 warmup"  # its config alone
    assert protocol("embedded_h100_concurrency", ROOT) == PROTO + ", 4 blocks"
    committed = json.loads((ROOT / "experiments/embedded_steps_nccl/metrics.json").read_text())
    assert protocol("embedded_steps_nccl", ROOT, committed) == PROTO + ", 8 blocks"  # blocks 0-7 in the record
    jobs = {k: {**e, "throughput_tok_s_n": 2} for k, e in METRICS["jobs"].items()}  # the record, not the config
    assert protocol("embedded_steps_nccl", ROOT, {"jobs": jobs}) == "2 runs x 500 greedy tokens per job, 1 warmup"


def test_bench_hint_names_the_stage_that_writes_the_metrics():
    assert bench_hint("ci_smoke", ROOT) == "`dvc repro bench@ci_smoke`"
    assert bench_hint("real_shape_h100x1", ROOT) == (
        "`dvc unfreeze bench_real_shape_h100x1 && dvc repro -f bench_real_shape_h100x1`"
    )
    assert bench_hint("kimi_k25_rtx6000x8_eagle3", ROOT) == "`dvc unfreeze bench_kimi && dvc repro -f bench_kimi`"
    assert bench_hint("real_shape_h200x2", ROOT).startswith("no DVC stage writes experiments/real_shape_h200x2/")


def _view(*args):
    return subprocess.run(
        [sys.executable, "-m", "spec_decode.views.experiment", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_views_refuse_what_holds_no_measured_jobs_and_write_nothing():
    status = ["git", "status", "--porcelain", "--", "experiments", "README.md"]  # what the views would write
    before = subprocess.run(status, cwd=ROOT, capture_output=True, text=True).stdout
    p = _view("report", "kimi_k25_rtx6000x8_eagle3")
    assert p.returncode != 0 and "holds a source's claim, not a measurement" in p.stderr, p.stderr
    p = _view("compare", "kimi_k25_rtx6000x8_eagle3")  # the claim against itself: no verdict
    assert p.returncode == 2 and "nothing was rebuilt: measure it first (`dvc unfreeze bench_kimi" in p.stderr
    assert "verdict" not in p.stdout
    p = _view("report", "drafter_layer_ids")
    assert p.returncode != 0 and "python -m spec_decode.views.drafter_experiments report drafter_layer_ids" in p.stderr
    assert "Traceback" not in p.stderr
    p = _view("compare", "real_shape_h200x2")  # offered by run.py, never measured
    assert p.returncode == 2 and "python -m spec_decode.bench experiment real_shape_h200x2" in p.stderr
    p = _view("compare", "ci_smoke", "--rev", "deadbeef0")  # the NAME form's own input errors too
    assert p.returncode == 2 and "experiments/ci_smoke/metrics.json is not in git at deadbeef0" in p.stderr
    for cmd in ("compare", "starts"):  # an unreadable sweep is an input error (2), not "a cell differs" (1)
        p = _view(cmd, "no/such/metrics.json", "ci_smoke")
        assert p.returncode == 2 and "sweep: no/such/metrics.json: no such file or directory" in p.stderr, p.stderr
    after = subprocess.run(status, cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before


def test_unchanged_metrics_warn_and_rebuilt_ones_do_not():
    committed = {"jobs": {"nccl=default,spec.steps=1": {"throughput_tok_s": 300.0}}}
    w = same_metrics_warning(dict(committed), committed, "ci_smoke", "HEAD")
    assert w.startswith("warning: experiments/ci_smoke/metrics.json in the workspace is the one committed at HEAD")
    assert "python -m spec_decode.bench rebuild ci_smoke" in w
    rebuilt = {"jobs": {"nccl=default,spec.steps=1": {"throughput_tok_s": 301.5}}}
    assert same_metrics_warning(rebuilt, committed, "ci_smoke", "HEAD") is None


def test_report_refuses_a_readme_without_its_markers_and_writes_nothing(tmp_path):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    d = tmp_path / "experiments" / "ci_smoke"
    d.mkdir(parents=True)
    shutil.copy(ROOT / "experiments/ci_smoke/metrics.json", d)
    (d / "README.md").write_text(f"# ci_smoke\n\n{experiment.BEGIN}\nold\n{experiment.END}\n")  # no facts markers
    with pytest.raises(SystemExit, match=r"README.md lacks <!-- facts:begin .*: add the markers"):
        experiment.report("ci_smoke", tmp_path)
    assert sorted(p.name for p in d.iterdir()) == ["README.md", "metrics.json"]
    assert (d / "README.md").read_text().endswith("old\n<!-- table:end -->\n")
