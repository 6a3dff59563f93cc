"""Small runs, as a new user's first commands make them (benchmark.runs=1 or 2, max_new_tokens=32): one run
has no interval (nan, as the speedup beside it), two noisy runs give no tok/s bound below 0 and no ranking
(the recommendation names benchmark.runs), and a warmup too short to write a decode-log line is no failed
self-check. Unit tests feed the job's own functions the run values and server-log lines of real jobs
(embedded engine, 2026-12-06); run.py and the doctor for real: tests/integration/test_small_runs_jobs.py."""

from __future__ import annotations

import math

import pytest

from spec_decode.analysis import recommend, sections, stats
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.record.runs import RunRecord
from spec_decode.runner import doctor

pytestmark = pytest.mark.unit

# `python run.py -m spec.steps=1,3 benchmark.runs=2 benchmark.max_new_tokens=32`: each job's two timed
# runs (32 tokens each, wall seconds). steps=3 printed `95% CI [-833.4, 1726.0]` and scored -833.4.
TWO_RUNS = {1: [0.08808550399771775, 0.09459775099821854], 3: [0.09259662499971455, 0.05849969799965038]}
# Its steps=3 server.log up to the warmup: the start-up lines (its engine.decode_log_interval=10) and
# no `Decode batch` line, as the warmup's 8 verifies are fewer than engine.decode_log_interval=10.
START_UP = (
    "[2026-12-06 11:59:39] front (pid 16738): plugins loaded: ['spec_decode_profiler']\n"
    '[2026-12-06 11:59:39] server_args={"cpu_threads": 1, "decode_log_interval": 10, "device": "cpu", '
    '"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "tp_size": 1}\n'
    "[2026-12-06 11:59:41] The server is fired up and ready to roll! (http://127.0.0.1:30000, pid 16738)\n"
)
SUMMARY = ("std", "cv", "robust_cv", "ci95_lo", "ci95_hi")


def runs_of(walls: list[float], tokens: int = 32) -> list[RunRecord]:
    return [
        RunRecord(launch=0, run=i, start_wall=i, end_wall=i + w, wall_s=w, prompt_tokens=9, completion_tokens=tokens)
        for i, w in enumerate(walls)
    ]


def job(steps: int, walls: list[float], tokens: int = 32) -> JobRecord:
    """A finished spec job whose tok/s figures are what the job computes (analysis.sections.throughput)."""
    runs = runs_of(walls, tokens)
    sec = sections.throughput(runs, launches=1)
    return JobRecord(
        role="spec",
        name=f"benchmark.runs={len(walls)},spec.steps={steps}",
        experiment="e",
        config={"nccl": {"name": "default"}, "spec": {"steps": steps, "simulate_accept_len": None}},
        config_hash="",
        engine=EngineInfo("embedded"),
        speculative=True,
        status="FINISHED",
        runs=runs,
        metrics=sec.metrics,
        throughput_tok_s=sec.fields["throughput_tok_s"],
    )


def test_one_run_has_no_interval_like_the_speedup_beside_it():
    """It printed `95% CI [443.1, 443.1]  CV 0.0%` (certain) beside the speedup's `[nan, nan]`."""
    sec = sections.throughput(runs_of([32 / 443.1]), launches=1)
    assert sec.metrics["throughput_tok_s"] == pytest.approx(443.1)
    assert {k: math.isnan(sec.metrics[f"throughput_tok_s_{k}"]) for k in SUMMARY} == dict.fromkeys(SUMMARY, True)
    assert math.isnan(sec.metrics["mde_pct"]) and sec.warnings == []
    speedup = stats.paired_ratio([443.1], [337.0])
    assert math.isnan(speedup.ci95_lo) and math.isnan(speedup.ci95_hi)


def test_two_noisy_runs_bound_tok_s_at_zero_and_keep_the_t_bound():
    s = sections.throughput(runs_of(TWO_RUNS[3]), launches=1).fields["throughput_tok_s"]
    assert (s.ci95_lo, round(s.ci95_hi, 1), round(s.extra["ci95_lo_unclipped"], 1)) == (0.0, 1726.0, -833.4)
    five = [88.1, 89.5, 88.8, 90.2, 87.4]  # the protocol's 5 runs: the plain t interval, nothing added
    s5 = stats.summarize(five)
    half = stats.t_ppf(0.975, 4) * s5.std / math.sqrt(5)
    assert (s5.ci95_lo, s5.ci95_hi, s5.extra) == (s5.mean - half, s5.mean + half, {})


def test_a_two_run_sweep_is_not_ranked_and_names_benchmark_runs():
    rec = recommend.recommend([job(k, walls) for k, walls in TWO_RUNS.items()])
    assert (rec.decision, rec.steps) == ("cannot decide", None)
    assert rec.reason == (
        "no stable cell: 2 of 2 noisy: unknown spread with 2 run(s) (< 3); "
        "rerun with benchmark.runs=3 or more (the protocol's 5)"
    )
    assert [v.score for v in rec.verdicts] == [None, None]
    cells = [line for line in recommend.describe(rec).splitlines() if line.startswith("  benchmark.runs=2")]
    assert len(cells) == 2 and all(line.endswith("; score -") for line in cells), cells


def test_a_one_run_cell_is_no_evidence_against_itself():
    """Three steady 5-run cells and a 1-run cell whose one value is below the best's bound: with no
    spread it could still be the better one, so the stable cells' best is no answer (issue 44's rule)."""
    steady = {
        k: [32 / (v * (1 + d)) for d in (-0.01, -0.005, 0.0, 0.005, 0.01)] for k, v in ((1, 300), (2, 350), (3, 420))
    }
    recs = [job(k, w) for k, w in steady.items()]
    assert recommend.recommend(recs).steps == 3
    rec = recommend.recommend([*recs, job(5, [32 / 380.0])])
    assert rec.decision == "cannot decide"
    assert "benchmark.runs=1,spec.steps=5 no interval (noisy); rerun with more runs (benchmark.runs)" in rec.reason


def request(
    tmp_path, log: str, verifies: int | None, tokens: int = 32, speculative: bool = True, interval: int | None = 10
):
    """The decode-log item for a request whose window starts after ``log`` (nothing written in it), on a
    job whose engine.decode_log_interval is ``interval``."""
    path = tmp_path / "server.log"
    path.write_text(log)
    run = RunRecord(
        launch=0, run=-1, start_wall=0.0, end_wall=1.0, wall_s=1.0, prompt_tokens=9,
        completion_tokens=tokens, spec_verify_ct=verifies,
    )  # fmt: skip
    items = doctor.request_checks(run, tmp_path / "profile.jsonl", path, path.stat().st_size, speculative, interval)
    return next(it for it in items if it.name == "decode-log lines")


def test_no_decode_line_is_a_failure_only_where_one_was_due(tmp_path):
    short = request(tmp_path, START_UP, verifies=8)  # the warmup above: 8 verifies < 10
    assert (short.ok, short.detail) == (True, "none due: 8 decode batches < engine.decode_log_interval=10")
    due = request(tmp_path, START_UP, verifies=12)
    assert (due.ok, due.detail) == (
        False,
        "no `Decode batch` line our parser reads (12 decode batches, engine.decode_log_interval=10)",
    )
    assert due.fix.startswith("lower engine.decode_log_interval below the request's decode batches")
    assert not request(tmp_path, START_UP, verifies=None, speculative=False).ok  # 31 decode batches: due
    assert request(tmp_path, START_UP, verifies=None, tokens=8, speculative=False).ok  # 7 < 10
    assert not request(tmp_path, START_UP, verifies=8, interval=None).ok  # the interval unknown: due, as before
