"""Statistics for noisy throughput: pure functions on lists of numbers (Student's t from scipy.special).

The unit of replication is the run (5 x 500 tokens by default), and the server launch when
``benchmark.launches > 1``. Method (shared/reference/measurement-and-peers.md §4):

- per job: mean, median, std (n-1), CV, Student-t 95% CI of the mean (t(0.975, 4) = 2.776 for 5 runs);
  one run gives no std, CV or CI (nan); a lower bound below 0 is clipped to 0 (tok/s cannot go negative);
- speedup A/B = mean(A) / mean(B), 95% CI by Welch's t on the log of the ratio (delta method):
  SE = sqrt(s_a^2 / (n_a m_a^2) + s_b^2 / (n_b m_b^2)), Welch-Satterthwaite df, CI = ratio * exp(+-t SE);
- paired speedup (baseline and spec runs alternating on two live servers): geometric mean of the per-pair
  ratios, t-CI on the mean log ratio with n_pairs - 1 df;
- minimum detectable effect of a two-sample t-test (alpha 0.05, power 0.8) from the observed CV:
  MDE = (t(0.975, df) + t(0.8, df)) * sqrt(2 / n) * CV; with 5 runs per arm that is about 2.0 CV;
- robust CV = 1.4826 x MAD / median (the step recommendation's stability measure, spec_decode.analysis.recommend);
- CV above 3% is flagged: a 5.9% gain needs CV <= ~3% to be seen with 5 runs.

The figures it returns are the record's types (``record.sections``: ``Summary``, ``Ratio``,
``VarianceComponents``): the record holds them.
"""

from __future__ import annotations

import math
import statistics

from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record.sections import Ratio, Summary, VarianceComponents

CV_WARN = 0.03


# Student's t through scipy.special, the functions scipy.stats.t calls (same bits for 0 < p < 1): importing
# scipy.stats costs ~0.4 s of CPU more, paid by every process that imports the record (run.py's jobs, the
# report, compare, sync, the model builds), and t is all we take from it. Imported on first use: a run.py
# that stops in preflight or at a config error imports this module (the sweep callback, the drift guard)
# and never calls t (scipy.special: ~0.2 s of CPU).
def t_ppf(p: float, df: float) -> float:
    """scipy.stats.t.ppf(p, df)."""
    with frozen_imports():  # lazy: ~0.2 s of CPU, paid on the first t only (above)
        from scipy import special

    return special.stdtrit(df, p)


def t_cdf(x: float, df: float) -> float:
    """scipy.stats.t.cdf(x, df)."""
    with frozen_imports():  # lazy: ~0.2 s of CPU, paid on the first t only (above)
        from scipy import special

    return special.stdtr(df, x)


MAD_TO_SD = 1.4826  # MAD x this = the standard deviation, for normal noise


def robust_cv(values: list[float]) -> float:
    """1.4826 x median(|x - median|) / median (nan for fewer than 2 values: no spread to measure)."""
    if len(values) < 2:
        return float("nan")
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return MAD_TO_SD * mad / med if med else float("nan")


def summarize(values: list[float], confidence: float = 0.95) -> Summary:
    """Mean, median, std, CV and the Student-t CI of the mean of a non-negative quantity (tok/s, accept
    lengths). One value has no spread and no interval: std, CVs and bounds are nan, as the speedup's with
    one pair. A lower bound below 0 (2 or 3 noisy values: t(0.975, 1) = 12.7) is clipped to 0, the raw
    bound kept in ``extra["ci95_lo_unclipped"]``; with 5 values it takes a CV above 80%."""
    if not values:
        raise ValueError("no values to summarize")
    n = len(values)
    mean = statistics.fmean(values)
    median = statistics.median(values)
    if n < 2:
        nan = float("nan")
        return Summary(n, mean, median, nan, nan, nan, nan, nan)
    std = statistics.stdev(values)
    half = t_ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    lo = mean - half
    s = Summary(
        n, mean, median, std, std / mean if mean else float("nan"), max(lo, 0.0), mean + half, robust_cv(values)
    )
    if lo < 0:  # a throughput below 0 is no bound at all; the record keeps what the t interval said
        s.extra["ci95_lo_unclipped"] = lo
    return s


def ratio_of_means(a: list[float], b: list[float], confidence: float = 0.95) -> Ratio:
    """mean(a) / mean(b) with a Welch CI on the log scale (see module doc)."""
    sa = statistics.stdev(a) if len(a) > 1 else 0.0
    sb = statistics.stdev(b) if len(b) > 1 else 0.0
    return ratio_from_summary(statistics.fmean(a), sa, len(a), statistics.fmean(b), sb, len(b), confidence)


def ratio_from_summary(ma: float, sa: float, na: int, mb: float, sb: float, nb: int, confidence: float = 0.95) -> Ratio:
    """The same ratio and CI from summary statistics (mean, std, n of each arm)."""
    r = ma / mb
    if na < 2 or nb < 2:
        return Ratio(r, float("nan"), float("nan"), float("nan"), False)
    va = sa * sa / (na * ma * ma)
    vb = sb * sb / (nb * mb * mb)
    se = math.sqrt(va + vb)
    if se == 0:
        return Ratio(r, r, r, float("inf"), r != 1.0)
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    t = t_ppf(0.5 + confidence / 2, df)
    lo, hi = r * math.exp(-t * se), r * math.exp(t * se)
    return Ratio(r, lo, hi, df, not (lo <= 1.0 <= hi))


def paired_ratio(a: list[float], b: list[float], confidence: float = 0.95) -> Ratio:
    """Speedup from pairs (a_i, b_i) measured back to back: the geometric mean of a_i / b_i with a
    Student-t CI on the mean log ratio (df = n - 1). Noise shared by a pair cancels in its ratio."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_ratio needs pairs: {len(a)} vs {len(b)} values")
    logs = [math.log(x / y) for x, y in zip(a, b)]
    n = len(logs)
    m = statistics.fmean(logs)
    if n < 2:
        return Ratio(math.exp(m), float("nan"), float("nan"), float("nan"), False)
    half = t_ppf(0.5 + confidence / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    lo, hi = math.exp(m - half), math.exp(m + half)
    return Ratio(math.exp(m), lo, hi, float(n - 1), not (lo <= 1.0 <= hi))


def min_detectable_effect(cv: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest relative difference a two-sample t-test with n runs per arm detects (as a fraction)."""
    if n < 2 or not math.isfinite(cv):
        return float("nan")
    df = 2 * n - 2
    return (t_ppf(1 - alpha / 2, df) + t_ppf(power, df)) * math.sqrt(2.0 / n) * cv


def variance_components(groups: list[list[float]]) -> VarianceComponents:
    """One-way random-effects split for launches (groups) x runs: std between launches and within.

    Returns std_within, std_between (0 when the between-launch mean square is below the within one)
    and the share of variance between launches."""
    groups = [g for g in groups if g]
    k = len(groups)
    if k < 2 or any(len(g) < 2 for g in groups):
        return VarianceComponents(k, None, None, None)
    n_bar = statistics.fmean(len(g) for g in groups)
    grand = statistics.fmean(v for g in groups for v in g)
    msw = sum(sum((v - statistics.fmean(g)) ** 2 for v in g) for g in groups) / sum(len(g) - 1 for g in groups)
    msb = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in groups) / (k - 1)
    var_between = max(0.0, (msb - msw) / n_bar)
    total = var_between + msw
    return VarianceComponents(k, math.sqrt(msw), math.sqrt(var_between), var_between / total if total > 0 else 0.0)


def acceptance(
    completion: int, verify_ct: int, correct: int | None, proposed: int | None, num_draft_tokens: int
) -> dict:
    """Acceptance from raw counters, each convention named (SGLang changed its 'accept rate').

    - accept_len: tokens committed per verify, incl. the bonus (and the prefill token), as SGLang's
      spec_accept_length = completion_tokens / spec_verify_ct;
    - accept_rate_draft: correct drafts / proposed drafts (SGLang >= 0.5.15 'accept rate');
    - accept_rate_incl_bonus: accepted tokens / (verify steps x num_draft_tokens) (SGLang <= 0.5.10).
    """
    out: dict = {"accept_len": completion / verify_ct if verify_ct else None}
    out["accept_rate_draft"] = correct / proposed if correct is not None and proposed else None
    out["accept_rate_incl_bonus"] = (
        completion / (verify_ct * num_draft_tokens) if verify_ct and num_draft_tokens else None
    )
    return out
