import math

import pytest
from scipy import stats as st

from spec_decode.analysis import stats

pytestmark = pytest.mark.unit


def test_summary_matches_textbook_t_interval():
    values = [88.1, 89.5, 88.8, 90.2, 87.4]
    s = stats.summarize(values)
    assert s.n == 5
    assert s.mean == pytest.approx(88.8)
    assert s.median == 88.8
    assert s.std == pytest.approx(1.10680, abs=1e-4)  # sample std (n-1)
    # t(0.975, 4) = 2.776 (the value every 5-run benchmark needs)
    assert st.t.ppf(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    half = 2.7764451 * s.std / math.sqrt(5)
    assert (s.ci95_lo, s.ci95_hi) == pytest.approx((88.8 - half, 88.8 + half), abs=1e-4)
    assert s.cv == pytest.approx(s.std / 88.8)


def test_single_value_has_no_interval():
    s = stats.summarize([5.0])
    assert (s.n, s.mean) == (1, 5.0)
    assert all(math.isnan(x) for x in (s.std, s.cv, s.ci95_lo, s.ci95_hi, s.robust_cv))
    with pytest.raises(ValueError):
        stats.summarize([])


def test_ratio_ci_is_welch_on_log_scale():
    a = [94.0, 95.1, 93.2, 96.9, 94.4]
    b = [88.8, 88.1, 89.9, 88.4, 89.0]
    r = stats.ratio_of_means(a, b)
    assert r.ratio == pytest.approx(sum(a) / sum(b))
    assert r.ci95_lo < r.ratio < r.ci95_hi
    assert r.significant  # a 6% gain at CV ~1% is resolvable
    # Independent cross-check: scipy's own Welch test on the log values. The log of a ratio of means
    # with ~1% CVs is the difference of the mean logs to within 1e-4, so the two intervals agree.
    welch = st.ttest_ind([math.log(x) for x in a], [math.log(x) for x in b], equal_var=False)
    lo, hi = welch.confidence_interval(0.95)
    assert (r.ci95_lo, r.ci95_hi) == pytest.approx((math.exp(lo), math.exp(hi)), rel=5e-4)
    assert r.df == pytest.approx(welch.df, rel=1e-2)


def test_ratio_not_significant_when_noise_is_large():
    a = [100, 80, 120, 90, 110]
    b = [95, 105, 85, 115, 100]
    assert not stats.ratio_of_means(a, b).significant


def test_mde_is_about_two_cv_for_five_runs():
    assert stats.min_detectable_effect(0.03, 5) == pytest.approx(2.02 * 0.03, rel=0.01)
    # the source story: 5.9% needs CV <= ~3%
    assert stats.min_detectable_effect(0.03, 5) > 0.059
    assert stats.min_detectable_effect(0.029, 5) < 0.059
    assert stats.min_detectable_effect(0.02, 3) > stats.min_detectable_effect(0.02, 5)


def test_variance_components_separate_launch_effect():
    within_only = stats.variance_components([[10, 11, 9, 10], [10, 9, 11, 10]])
    assert within_only.std_between == 0.0
    shifted = stats.variance_components([[10, 10.1, 9.9], [20, 20.1, 19.9]])
    assert shifted.between_share > 0.99


def test_acceptance_conventions():
    acc = stats.acceptance(completion=500, verify_ct=200, correct=300, proposed=400, num_draft_tokens=3)
    assert acc["accept_len"] == 2.5
    assert acc["accept_rate_draft"] == 0.75
    assert acc["accept_rate_incl_bonus"] == pytest.approx(500 / 600)
    # the source story: accept len 1.73 at 3 draft tokens printed "accept rate 0.57" (old convention)
    old = stats.acceptance(173, 100, None, None, 3)
    assert old["accept_rate_incl_bonus"] == pytest.approx(0.577, abs=1e-3)
    assert old["accept_rate_draft"] is None


@pytest.mark.parametrize("df", [1, 2, 4, 11, 29.5, 1e6])
def test_t_through_scipy_special_is_scipy_stats_t_bit_for_bit(df):
    """stats.t_ppf / t_cdf (scipy.special, cheaper to import) give exactly scipy.stats.t's numbers."""
    for p in (0.5, 0.8, 0.9, 0.95, 0.975, 0.995, 1e-6, 1 - 1e-9):
        assert stats.t_ppf(p, df) == st.t.ppf(p, df)
    for x in (-3.0, -0.2, 0.0, 0.7, 1.96, 12.0):
        assert stats.t_cdf(x, df) == st.t.cdf(x, df)
