"""Per-request and per-position acceptance (spec_decode.analysis.acceptance) on hand-counted cases, and the cost
model using the measured per-position rates instead of its fitted decay."""

import pytest

from spec_decode.analysis import acceptance
from spec_decode.analysis.costmodel import Point, chain_accept_len, fit, fitted_rate, rates_vs_fit
from spec_decode.record.measured import Request
from spec_decode.runner.client import RunRecord

pytestmark = pytest.mark.unit


def run(i: int, completion: int, verify: int, hist: list[int] | None = None) -> RunRecord:
    r = RunRecord(
        launch=0,
        run=i,
        start_wall=float(i),
        end_wall=i + 0.5,
        wall_s=0.5,
        prompt_tokens=10,
        completion_tokens=completion,
        spec_verify_ct=verify,
    )
    if hist is not None:  # the client's field once it reads meta_info's histogram (issue 21, H2)
        r.spec_correct_drafts_histogram = hist
    return r


def cycles(accepted_drafts: list[int]) -> list[dict]:
    return [{"t": float(i), "cycle_ms": 5.0, "accepted": a + 1} for i, a in enumerate(accepted_drafts)]


def test_rate_at_each_position_is_conditional_on_reaching_it():
    # 100 verifies at 3 steps: 10 accepted none, 20 one, 30 two, 40 all three
    rates = acceptance.per_position_rates([10, 20, 30, 40])
    # reached >= 1: 90 of 100; >= 2: 70 of 90; >= 3: 40 of 70 -- not the unconditional 0.9 / 0.7 / 0.4
    assert rates == [pytest.approx(0.9), pytest.approx(70 / 90), pytest.approx(40 / 70)]
    assert acceptance.accept_len_from_rates(rates) == pytest.approx(1 + (20 + 60 + 120) / 100)
    assert acceptance.per_position_rates([5, 0, 0]) == [0.0, None]  # position 2 never reached: no rate


def test_request_lengths_weighted_by_verifies_and_unweighted():
    reqs = [acceptance.Counted(100, 50, None), acceptance.Counted(10, 2, None)]
    weighted, unweighted = acceptance.request_lengths(reqs)
    assert weighted == pytest.approx(110 / 52)  # each verify counts once: the long request dominates
    assert unweighted == pytest.approx((2.0 + 5.0) / 2)  # each request counts once


def test_profile_cycles_are_the_source_and_agree_with_meta_info():
    runs = [run(0, 7, 3, [1, 1, 1]), run(1, 6, 2, [0, 0, 2])]
    per_run = [cycles([0, 1, 2]), cycles([2, 2])]
    acc = acceptance.summarize(2, runs, per_run)
    assert acc.source == "profile" and acc.histogram == [1, 1, 3]
    assert acc.profile_matches_meta_info is True
    assert [r["histogram"] for r in acc.per_request] == [[1, 1, 1], [0, 0, 2]]
    assert acc.accept_len_weighted == pytest.approx(13 / 5)
    assert acc.accept_len_unweighted == pytest.approx((7 / 3 + 3.0) / 2)
    m = acceptance.metrics_of(acc)
    assert m == {
        "accept_len_request_weighted": pytest.approx(13 / 5),
        "accept_len_request_mean": pytest.approx((7 / 3 + 3.0) / 2),
        "accept_rate_pos1": pytest.approx(4 / 5),
        "accept_rate_pos2": pytest.approx(3 / 4),
    }
    # a profile that disagrees with the counters is reported as such
    assert acceptance.summarize(2, runs, [cycles([0, 0, 2]), cycles([2, 2])]).profile_matches_meta_info is False


def test_meta_info_histograms_when_the_profile_cannot_say():
    runs = [run(0, 7, 3, [1, 1, 1]), run(1, 6, 2, [0, 0, 2])]
    # a batch of two requests: a cycle committing 5 tokens at 2 steps is not one request's verify
    batched = [cycles([0, 1, 4]), cycles([2, 2])]
    acc = acceptance.summarize(2, runs, batched)
    assert acc.source == "meta_info" and acc.histogram == [1, 1, 3]
    assert acceptance.summarize(2, runs, None).source == "meta_info"
    # neither: lengths only
    bare = acceptance.summarize(2, [run(0, 7, 3)], None)
    assert bare.histogram is None and bare.per_position is None and bare.accept_len_weighted == 7 / 3


def request(index: int, tokens: int, verify: int, hist: list[int]) -> Request:
    """A request pass's entry (``runner.request_pass.entry``) with these counters."""
    return Request(index, "qa", tokens, 1.0, float(tokens), tokens / verify, verify, None, hist, None, None)


def test_request_pass_entries_are_the_requests_when_present():
    runs = [run(0, 100, 50), run(1, 100, 50)]
    passed = [request(0, 90, 30, [0, 0, 30]), request(1, 60, 60, [60, 0, 0])]
    acc = acceptance.summarize(2, runs, None, passed)
    assert acc.requests_from == "request pass" and len(acc.per_request) == 2
    assert acc.accept_len_unweighted == pytest.approx((3.0 + 1.0) / 2)
    assert acc.histogram == [60, 0, 30] and acc.source == "meta_info"


def test_cost_model_predicts_from_measured_rates_and_labels_the_fallback():
    """Acceptance that no decay curve describes (a weak position 2, then strong again): the fitted
    alpha x decay^(i-1) cannot reproduce it; the measured rates do, exactly."""
    rates = [0.9, 0.5, 0.95]
    pts = []
    for k in (1, 2, 3):
        L = acceptance.accept_len_from_rates(rates[:k])
        parts = {"draft_ms": 0.5 * k, "verify_ms": 3.0 + 0.2 * (k + 1), "extend_ms": 1.0, "other_ms": 0.1}
        pts.append(Point(k, L, throughput_tok_s=L / (sum(parts.values()) / 1e3), accept_rates=rates[:k], **parts))
    f = fit(pts, max_steps=5)
    assert f.accept_rates == rates and f.rates_steps == 3
    by_k = {p["steps"]: p for p in f.predictions}
    for k in (1, 2, 3):
        assert by_k[k]["predicted_accept_len"] == pytest.approx(acceptance.accept_len_from_rates(rates[:k]), abs=1e-12)
        assert by_k[k]["accept_len_from"] == "measured rates (steps=3)"
        assert by_k[k]["predicted_tok_s"] == pytest.approx(by_k[k]["measured_tok_s"], rel=1e-6)
    # beyond position 3: the fitted rates continue the measured chain
    p3 = 0.9 * 0.5 * 0.95
    assert by_k[4]["predicted_accept_len"] == pytest.approx(by_k[3]["predicted_accept_len"] + p3 * fitted_rate(f, 4))
    assert by_k[4]["accept_len_from"] == "measured rates 1..3 (steps=3) + fit beyond"
    # the fit alone misses this shape (what the measured rates buy): at 1 step it is 0.07 tokens off
    assert abs(chain_accept_len(f.alpha, 1, f.decay) - by_k[1]["predicted_accept_len"]) > 0.05
    table = rates_vs_fit(f)
    assert [r["measured"] for r in table] == rates and abs(table[2]["diff"]) > 0.3


def test_cost_model_without_rates_is_the_fit():
    pts = [Point(k, chain_accept_len(0.8, k), 0.5 * k, 3.0, 1.0, 0.1, 100.0) for k in (1, 2, 3)]
    f = fit(pts)
    assert f.accept_rates is None and {p["accept_len_from"] for p in f.predictions} == {"fit"}
    assert f.predictions[4]["predicted_accept_len"] == pytest.approx(chain_accept_len(f.alpha, 5, f.decay))
