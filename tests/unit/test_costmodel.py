"""The cost model on synthetic sweeps whose optimum is known."""

import numpy as np
import pytest

from spec_decode.analysis.costmodel import Point, chain_accept_len, describe, fit, nonneg_line

pytestmark = pytest.mark.unit


def synthetic(alpha, verify, per_tok, draft_per_step, ks, noise=0.0):
    pts = []
    for i, k in enumerate(ks):
        L = chain_accept_len(alpha, k)
        parts = dict(draft_ms=draft_per_step * k, verify_ms=verify + per_tok * (k + 1), extend_ms=2.0, other_ms=1.0)
        cyc = sum(parts.values())
        tput = L / (cyc / 1e3) * (1 + (noise if i % 2 else -noise))
        pts.append(Point(k, L, throughput_tok_s=tput, **parts))
    return pts


def brute_force_best(alpha, verify, per_tok, draft_per_step, kmax=8, kmin=1):
    def tps(k):
        return chain_accept_len(alpha, k) / ((draft_per_step * k + verify + per_tok * (k + 1) + 3.0) / 1e3)

    return max(range(kmin, kmax + 1), key=tps)


@pytest.mark.parametrize(
    "alpha,verify,per_tok,draft",
    [(0.8, 10.0, 0.5, 1.0), (0.5, 10.0, 0.5, 1.5), (0.9, 5.0, 0.1, 0.3), (0.49, 11.0, 2.0, 1.2)],
)
def test_recovers_parameters_and_known_optimum(alpha, verify, per_tok, draft):
    f = fit(synthetic(alpha, verify, per_tok, draft, [1, 2, 3, 5]))
    assert f.alpha == pytest.approx(alpha, abs=1e-3)
    assert f.verify == pytest.approx((verify, per_tok), abs=1e-6)
    # the best within the measured steps 1..5; a better one beyond them only as a labelled extrapolation
    assert f.best_steps == brute_force_best(alpha, verify, per_tok, draft, kmax=5)
    overall = brute_force_best(alpha, verify, per_tok, draft)
    assert (f.best_outside or {}).get("steps", f.best_steps) == overall
    if overall > 5:  # a better step count beyond the measured ones: printed only as a labelled extrapolation
        assert f"EXTRAPOLATION: steps={overall}" in describe(f)
    assert f.predictions[3]["measured_tok_s"] is None  # steps=4 was not measured
    assert f.predictions[3]["predicted_accept_len"] == pytest.approx(chain_accept_len(alpha, 4))


def test_decaying_acceptance_is_recovered_and_moves_the_optimum():
    """A drafter whose acceptance decays with depth: the i.i.d. model would pick a too-long chain."""

    def pts(decay):
        out = []
        for k in (1, 2, 3, 5):
            L = chain_accept_len(0.95, k, decay)
            parts = {"draft_ms": 0.4 * k, "verify_ms": 3.3 + 0.13 * (k + 1), "extend_ms": 0.9, "other_ms": 0.0}
            out.append(Point(k, L, throughput_tok_s=L / (sum(parts.values()) / 1e3), **parts))
        return out

    f = fit(pts(0.85))
    assert (f.alpha, f.decay) == (pytest.approx(0.95, abs=1e-3), pytest.approx(0.85, abs=1e-3))
    truth = max(range(1, 9), key=lambda k: chain_accept_len(0.95, k, 0.85) / (0.4 * k + 3.3 + 0.13 * (k + 1) + 0.9))
    assert (f.best_outside or {}).get("steps", f.best_steps) == truth
    assert fit(pts(1.0)).decay == pytest.approx(1.0, abs=1e-3)


def test_interval_reflects_residuals():
    exact = fit(synthetic(0.8, 10, 0.5, 1.0, [1, 2, 3, 5]))
    noisy = fit(synthetic(0.8, 10, 0.5, 1.0, [1, 2, 3, 5], noise=0.05))
    assert exact.best_tok_s[2] - exact.best_tok_s[1] < 1e-3 * exact.best_tok_s[0]
    assert noisy.best_tok_s[2] - noisy.best_tok_s[1] > 0.05 * noisy.best_tok_s[0]


def test_source_story_alpha():
    # accept length 1.73 at 2 steps -> alpha ~ 0.49; one more step would give only ~1.85
    f = fit([Point(2, 1.73, 1.0, 18.66, 0.5, 0.1), Point(1, 1.49, 0.5, 18.0, 0.5, 0.1)])
    assert f.alpha == pytest.approx(0.49, abs=0.02)
    assert chain_accept_len(f.alpha, 3) == pytest.approx(1.85, abs=0.05)


def test_needs_two_points():
    with pytest.raises(ValueError):
        fit([Point(1, 1.5, 1, 1, 1, 1)])


def noisy_sweep_with_negative_verify_slope() -> list[Point]:
    """Issue 25's sweep shape: steps 1, 2, 3, 5 whose verify times fall with the verified tokens under
    host noise, so ordinary least squares gives exactly verify = 4.44 + -0.401 x tokens ms."""
    pts = []
    for k in (1, 2, 3, 5):
        L = chain_accept_len(0.7, k)
        parts = {"draft_ms": 0.3 + 0.35 * k, "verify_ms": 4.44 - 0.401 * (k + 1), "extend_ms": 0.5, "other_ms": 0.2}
        pts.append(Point(k, L, throughput_tok_s=L / (sum(parts.values()) / 1e3), **parts))
    return pts


def test_noisy_sweep_gives_no_negative_cost_and_no_unlabelled_best_beyond_measured_steps():
    pts = noisy_sweep_with_negative_verify_slope()
    # the unconstrained fit the model used to make: the input is the issue's
    slope, intercept = np.polyfit([p.steps + 1 for p in pts], [p.verify_ms for p in pts], 1)
    assert (round(intercept, 2), round(slope, 3)) == (4.44, -0.401)
    f = fit(pts)
    assert min(f.verify + f.draft + f.extend) >= 0 and f.other_ms >= 0  # physical: no negative cost
    assert f.verify[1] == 0.0  # the falling verify line is clamped flat, not sloped down
    assert f.fit_quality["verify"]["r2"] < 0.5 and f.fit_quality["draft"]["r2"] == pytest.approx(1.0)
    assert f.measured_steps == (1, 5) and 1 <= f.best_steps <= 5
    assert [r["steps"] for r in f.predictions if r["extrapolated"]] == [6, 7, 8]
    text = describe(f)
    assert "verify = " in text and "+ -" not in text  # no negative slope printed
    assert "R^2" in text
    # every "best" the console names beyond steps 5 carries the extrapolation label
    for line in text.splitlines():
        if "best" in line.lower() and any(f"steps={k}" in line for k in (6, 7, 8)):
            assert "EXTRAPOLATION" in line, line
    if f.best_outside is not None:
        assert f.best_outside["steps"] > 5 and "EXTRAPOLATION: steps=" in text


def test_nonneg_line_states_fit_quality():
    a, b, q = nonneg_line([1, 2, 3], [2.0, 4.0, 6.0])
    assert (a, b) == (pytest.approx(0.0, abs=1e-9), pytest.approx(2.0)) and q["r2"] == pytest.approx(1.0)
    a, b, q = nonneg_line([1, 2, 3], [3.0, 2.0, 1.0])  # falling: clamped to a flat line at the mean
    assert (a, b) == (pytest.approx(2.0), 0.0) and q["r2"] == pytest.approx(0.0) and q["rms_ms"] > 0.8


def test_two_step_counts_never_predict_a_negative_bound():
    """ci_smoke's two step counts (1, 3): the residual sd has 1 df (t = 12.7), so the interval is wide; a
    throughput's lower bound stops at 0 (it printed [-636.1, ...])."""
    pts = [
        Point(1, 1.98, 0.01, 1.88, 0.56, 0.1, throughput_tok_s=300.0),
        Point(3, 3.85, 0.65, 2.17, 0.56, 0.1, throughput_tok_s=240.0),  # far below what the model says
    ]
    f = fit(pts)
    assert all(r["lo"] >= 0.0 for r in f.predictions) and f.best_tok_s[1] >= 0.0
    assert any(r["lo"] == 0.0 for r in f.predictions)  # the raw t bound went below 0: clipped, not dropped
