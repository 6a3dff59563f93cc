"""What the README and compare say about a reported experiment comes from its metrics.json: the headline
table is generated from it; compare warns when the workspace metrics are the committed ones."""

import pytest

from spec_decode.views import experiment
from spec_decode.views.compare import same_metrics_warning
from spec_decode.views.experiment import headline

pytestmark = pytest.mark.unit

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
    text = headline(METRICS, "embedded_steps_nccl")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| baseline | default | 300 [290, 310]   | -                           | -            | -                   "
        "| -          | -                               | ok       |",
        "| steps=3  | default | 450 [440, 460]   | 1.50x [1.47, 1.53] (paired) | 3.62         | 0.88                "
        "| 8.00       | 1.50 / 5.00 / 1.40              | ok       |",
    ]  # the FAILED job has no numbers to show
    assert "python run.py -m experiment=embedded_steps_nccl" in text and "0123456789" in text


def test_headline_replaces_its_block_and_nothing_else(tmp_path, monkeypatch):
    (tmp_path / "experiments" / "x").mkdir(parents=True)
    (tmp_path / "experiments" / "x" / "metrics.json").write_text(__import__("json").dumps(METRICS))
    readme = tmp_path / "README.md"
    begin, end = experiment.HEADLINE_BEGIN.format(name="x"), experiment.HEADLINE_END
    readme.write_text(f"# title\n\n{begin}\nold table\n{end}\n\nafter\n")
    experiment.write_headline("x", tmp_path, readme)
    body = readme.read_text()
    assert "old table" not in body and "1.50x [1.47, 1.53] (paired)" in body
    assert body.startswith("# title\n\n") and body.endswith(f"{end}\n\nafter\n")
    experiment.write_headline("x", tmp_path, readme)
    assert readme.read_text() == body  # idempotent


def test_unchanged_metrics_warn_and_rebuilt_ones_do_not():
    committed = {"jobs": {"nccl=default,spec.steps=1": {"throughput_tok_s": 300.0}}}
    w = same_metrics_warning(dict(committed), committed, "ci_smoke", "HEAD")
    assert w.startswith("warning: experiments/ci_smoke/metrics.json in the workspace is the one committed at HEAD")
    assert "python -m spec_decode.bench rebuild ci_smoke" in w
    rebuilt = {"jobs": {"nccl=default,spec.steps=1": {"throughput_tok_s": 301.5}}}
    assert same_metrics_warning(rebuilt, committed, "ci_smoke", "HEAD") is None
