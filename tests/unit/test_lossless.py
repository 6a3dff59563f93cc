"""The lossless guard, the request pass's categories and the latency percentiles, through
analysis.finish on a composed config with real files (outputs.jsonl) in tmp dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from spec_decode.analysis import finish as analysis_finish
from spec_decode.analysis import latency, lossless
from spec_decode.core.prompts import Prompt, load_prompt_set
from spec_decode.engines.engine import named
from spec_decode.record import results
from spec_decode.record.outputs import write as write_outputs
from spec_decode.record.results import JobRecord
from spec_decode.record.sections import Category, Summary
from spec_decode.runner import request_pass
from spec_decode.runner.client import RunRecord

from .test_record import ROOT, new

pytestmark = pytest.mark.unit
GOOD = [(7 * i) % 256 for i in range(500)]


def ids_diverging_at(pos: int, ids=GOOD) -> list[int]:
    out = list(ids)
    out[pos] = (out[pos] + 1) % 256
    return out


def run(i: int, ids: list[int] | None, verify_ct: int | None = 200, t0: float = 0.0, **kw) -> RunRecord:
    n = len(ids) if ids is not None else 500
    return RunRecord(
        launch=0,
        run=i,
        start_wall=t0,
        end_wall=t0 + 1,
        wall_s=1.0,
        prompt_tokens=10,
        completion_tokens=n,
        spec_verify_ct=verify_ct,
        output_ids=ids,
        **kw,
    )


def baseline(tmp_path: Path, ids: list[int] | None = GOOD, outputs: dict[int, list[int]] | None = None) -> JobRecord:
    bdir = tmp_path / "baseline"
    bdir.mkdir()
    if outputs is not None:
        prompts = [Prompt(i, "x") for i in outputs]
        write_outputs(bdir, prompts, [run(i, v, None) for i, v in outputs.items()])
    return JobRecord(
        role="baseline",
        name="baseline",
        experiment="x",
        config={},
        config_hash="",
        engine=results.EngineInfo("embedded"),
        speculative=False,
        status="FINISHED",
        runs=[run(0, ids, None), run(1, ids, None)],
        throughput_tok_s=Summary(mean=500.0),
        out_dir=str(bdir),
    )


def finish(tmp_path: Path, rec, cfg, base) -> None:
    out = tmp_path / "spec"
    out.mkdir(exist_ok=True)
    analysis_finish.finish(
        rec, cfg, "FINISHED", None, analysis_finish.Measured(out, out / "server.log"), base, named(rec.engine.name)
    )


def test_planted_divergence_at_17_fails_the_embedded_job(tmp_path):
    cfg, rec = new(tmp_path)
    rec.runs = [run(0, GOOD), run(1, ids_diverging_at(17)), run(2, ids_diverging_at(40))]
    finish(tmp_path, rec, cfg, baseline(tmp_path))
    g = rec.lossless
    assert g.verdict == "fail" and g.checked is True
    assert g.first_divergence == {"timed:0": 17}  # the earliest of the two divergent runs
    assert (g.requests, g.matched) == (3, 1) and rec.metrics["lossless_match_rate"] == pytest.approx(1 / 3)
    assert "lossless_vs_baseline" in rec.failed_checks
    assert "prompt timed:0 at token 17" in {c.name: c for c in rec.checks}["lossless_vs_baseline"].message


def test_on_sglang_a_divergence_is_a_warning_with_the_position(tmp_path):
    cfg, rec = new(tmp_path)
    rec.engine.name = "sglang"
    rec.runs = [run(0, ids_diverging_at(17)), run(1, GOOD)]
    finish(tmp_path, rec, cfg, baseline(tmp_path))
    assert rec.lossless.verdict == "warn" and rec.lossless.first_divergence == {"timed:0": 17}
    assert "lossless_vs_baseline" not in rec.failed_checks
    assert any("lossless guard" in w and "token 17" in w for w in rec.warnings)


def test_equal_outputs_pass_and_the_last_cycles_overshoot_still_matches(tmp_path):
    cfg, rec = new(tmp_path, "benchmark.max_new_tokens=500")
    rec.runs = [run(0, GOOD + [1, 2]), run(1, GOOD)]  # the last cycle committed 2 tokens past 500
    finish(tmp_path, rec, cfg, baseline(tmp_path))
    assert rec.lossless.verdict == "pass" and rec.lossless.match_rate == 1.0
    assert {c.name: c.ok for c in rec.checks}["lossless_vs_baseline"] is True
    # an output that stopped early (an EOS the baseline did not take) diverges where it stopped
    assert lossless.first_divergence(GOOD[:300], GOOD, 500) == 300


def test_request_pass_outputs_compared_by_prompt_index(tmp_path):
    cfg, rec = new(tmp_path, "benchmark.request_max_new_tokens=20")
    rec.runs = [run(0, GOOD)]
    mine = {0: GOOD[:20], 1: GOOD[20:40], 3: ids_diverging_at(5, GOOD[:20])}
    out = tmp_path / "spec"
    out.mkdir()
    prompts = [Prompt(i, "x", "qa") for i in mine]
    runs = [run(i, v) for i, v in mine.items()]
    write_outputs(out, prompts, runs)
    rec.requests = [request_pass.entry(p, r) for p, r in zip(prompts, runs)]
    finish(tmp_path, rec, cfg, baseline(tmp_path, outputs={0: GOOD[:20], 1: GOOD[20:40], 3: GOOD[:20]}))
    assert rec.lossless.first_divergence == {"3": 5}
    assert (rec.lossless.requests, rec.lossless.matched) == (4, 3)  # 1 timed run + 3 requests
    assert rec.requests[2].output_sha256 != rec.requests[0].output_sha256


@pytest.mark.parametrize("why", ["forced", "no_baseline", "no_ids", "baseline_role"])
def test_skipped_with_the_reason(tmp_path, why):
    cfg, rec = new(tmp_path, role="baseline" if why == "baseline_role" else "spec")
    rec.runs = [run(0, None if why == "no_ids" else ids_diverging_at(3))]
    if why == "forced":
        rec.config["spec"]["simulate_accept_len"] = 2.0
    finish(tmp_path, rec, cfg, None if why == "no_baseline" else baseline(tmp_path))
    g = rec.lossless
    assert g.verdict == "skipped" and g.checked is False and "lossless_match_rate" not in rec.metrics
    assert g.reason == {
        "forced": "performance-only (forced acceptance)",
        "no_baseline": "no baseline arm to compare with",
        "baseline_role": "a baseline job (no speculation to check)",
    }.get(why, g.reason)
    assert "lossless_vs_baseline" not in {c.name for c in rec.checks}


def test_sampling_is_skipped():
    g = lossless.guard([lossless.Comparison("0", [1], [2], 1)], True, 0.7, False, True)
    assert g.verdict == "skipped" and "temperature 0.7" in g.reason


def test_categories_aggregate_run_scoped_accept_length_and_median_tok_s(tmp_path):
    cfg, rec = new(tmp_path)
    rec.runs = [run(0, GOOD)]

    def e(cat: str, tokens: int, verify: int, wall: float) -> dict:
        r = RunRecord(
            launch=0,
            run=0,
            start_wall=0,
            end_wall=wall,
            wall_s=wall,
            prompt_tokens=5,
            completion_tokens=tokens,
            spec_verify_ct=verify,
        )
        return request_pass.entry(Prompt(0, "x", cat), r)

    rec.requests = [e("code", 100, 50, 1.0), e("code", 100, 25, 0.5), e("qa", 90, 30, 0.3), e("code", 40, 10, 0.1)]
    finish(tmp_path, rec, cfg, None)
    # code: 240 tokens / 85 verifies (not the mean of 2.0, 4.0, 4.0); tok/s median of 100, 200, 400
    assert rec.categories["code"] == Category(3, pytest.approx(240 / 85), 200.0)
    assert rec.categories["qa"].accept_len == 3.0
    m = rec.metrics
    assert m["category_code_accept_len"] == pytest.approx(240 / 85) and m["category_qa_throughput_tok_s"] == 300.0


def test_latency_percentiles_of_streamed_runs(tmp_path):
    cfg, rec = new(tmp_path)
    # 3 streamed runs of 11 tokens: TTFT 10/20/30 ms, 10 gaps each, wall 300/600/900 ms
    rec.runs = [
        run(k, GOOD[:11], ttft_s=0.01 * (k + 1), token_gaps_s=[0.01 * (k + 1)] * 10, stream=True) for k in range(3)
    ]
    for k, r in enumerate(rec.runs):
        r.wall_s = 0.3 * (k + 1)
    finish(tmp_path, rec, cfg, None)
    lat = rec.latency
    assert lat.ttft_ms.p50 == pytest.approx(20.0) and lat.ttft_ms.n == 3
    assert lat.ttft_ms.p90 == pytest.approx(28.0)  # linear between order statistics
    assert lat.itl_ms.n == 30 and lat.itl_ms.mean == pytest.approx(20.0)
    assert lat.tpot_ms.p50 == pytest.approx(58.0)  # (600 - 20) / 10 tokens after the first
    assert lat.e2e_ms.p99 == pytest.approx(600 + 300 * 0.98)
    assert rec.metrics["itl_ms_p99"] == pytest.approx(latency.percentile([10] * 10 + [20] * 10 + [30] * 10, 99))
    assert set(latency.metrics_of(lat)) == {f"{k}_p{q}" for k in latency.KINDS for q in (50, 90, 99)}


def test_non_streamed_runs_have_no_latency_section(tmp_path):
    cfg, rec = new(tmp_path)
    rec.runs = [run(0, GOOD)]
    finish(tmp_path, rec, cfg, None)
    assert rec.latency is None and not any(k.startswith("ttft") for k in rec.metrics)


def test_record_with_new_sections_reads_back_equal(tmp_path):
    cfg, rec = new(tmp_path)
    rec.runs = [
        run(0, GOOD[:5], ttft_s=0.01, token_gaps_s=[0.001] * 4, stream=True, spec_correct_drafts_histogram=[1, 2, 3])
    ]
    finish(tmp_path, rec, cfg, baseline(tmp_path))
    results.write(tmp_path / "spec", rec)
    back = results.read(tmp_path / "spec")
    assert back.runs[0].output_ids == GOOD[:5] and back.runs[0].token_gaps_s == [0.001] * 4
    assert back.latency == rec.latency and back.lossless == rec.lossless


def test_prompt_sets_with_categories_and_mt_bench_turns(tmp_path):
    ps = load_prompt_set(ROOT / "data" / "prompts_categorized.jsonl")
    assert {p.category for p in ps} == {"narrative", "qa", "summarization", "translation", "math", "code"}
    assert [p.index for p in ps] == list(range(len(ps)))
    plain = load_prompt_set(ROOT / "data" / "prompts.jsonl")  # plain sets still load
    assert {p.category for p in plain} == {"uncategorized"}
    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]}\n')
    assert load_prompt_set(f) == [Prompt(0, "Write a poem.", "writing")]
    f.write_text('{"text": "a"}\n{"text": "b", "category": "math reasoning"}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2: \"category\" must be"):
        load_prompt_set(f)
