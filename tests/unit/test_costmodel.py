"""The cost model on synthetic sweeps whose optimum is known."""

import pytest

from spec_decode.analysis.costmodel import Point, chain_accept_len, fit

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


def brute_force_best(alpha, verify, per_tok, draft_per_step, kmax=8):
    def tps(k):
        return chain_accept_len(alpha, k) / ((draft_per_step * k + verify + per_tok * (k + 1) + 3.0) / 1e3)
    return max(range(1, kmax + 1), key=tps)


@pytest.mark.parametrize("alpha,verify,per_tok,draft", [(0.8, 10.0, 0.5, 1.0), (0.5, 10.0, 0.5, 1.5),
                                                        (0.9, 5.0, 0.1, 0.3), (0.49, 11.0, 2.0, 1.2)])
def test_recovers_parameters_and_known_optimum(alpha, verify, per_tok, draft):
    f = fit(synthetic(alpha, verify, per_tok, draft, [1, 2, 3, 5]))
    assert f.alpha == pytest.approx(alpha, abs=1e-3)
    assert f.verify == pytest.approx((verify, per_tok), abs=1e-6)
    assert f.best_steps == brute_force_best(alpha, verify, per_tok, draft)
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
    assert f.best_steps == truth
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
