"""The profiler's own effect on the numbers it sits beside (pure functions).

The timed runs run with the hooks dormant; the profiled pass after them runs pairs of the same request,
one with the profiler on and one dormant, back to back (ABBA). The effect is the paired ratio
``on / dormant`` (geometric mean, Student-t CI on the mean log ratio: ``stats.paired_ratio``): noise
shared by a pair cancels. The profile's phase shares are measured in the "on" runs, so they travel
with those runs' tok/s. The profiled pass's tok/s against the timed runs' (unpaired: minutes apart)
is reported beside it, labelled as such.
"""

from __future__ import annotations

import statistics

from spec_decode.analysis import stats


def effect(on_tok_s: list[float], dormant_tok_s: list[float], timed_tok_s: list[float]) -> dict | None:
    """{"effect_pct", "ci95_lo_pct", "ci95_hi_pct", "pairs", ...}: the profiler's effect on tok/s (negative:
    it slows the engine). None without a pair."""
    n = min(len(on_tok_s), len(dormant_tok_s))
    if n == 0:
        return None
    r = stats.paired_ratio(on_tok_s[:n], dormant_tok_s[:n])
    out = {
        "pairs": n,
        "on_tok_s": statistics.fmean(on_tok_s[:n]),
        "dormant_tok_s": statistics.fmean(dormant_tok_s[:n]),
        "effect_pct": 100 * (r.ratio - 1),
        "ci95_lo_pct": 100 * (r.ci95_lo - 1),
        "ci95_hi_pct": 100 * (r.ci95_hi - 1),
        "significant": r.significant,
        "method": "paired: geometric mean of on/dormant per adjacent pair, t-CI (n-1 df)",
    }
    if timed_tok_s:
        timed = statistics.fmean(timed_tok_s)
        out["timed_tok_s"] = timed
        out["on_vs_timed_pct"] = 100 * (out["on_tok_s"] / timed - 1)
        out["dormant_vs_timed_pct"] = 100 * (out["dormant_tok_s"] / timed - 1)
    return out


def metrics_of(e: dict | None) -> dict[str, float]:
    """The flat MLflow metrics of ``effect``'s result (units in the names)."""
    if not e:
        return {}
    out = {
        "profiler_effect_pct": e["effect_pct"],
        "profiled_pass_tok_s": e["on_tok_s"],
        "profiler_dormant_tok_s": e["dormant_tok_s"],
    }
    if e["pairs"] >= 2:
        out.update(profiler_effect_ci95_lo_pct=e["ci95_lo_pct"], profiler_effect_ci95_hi_pct=e["ci95_hi_pct"])
    return out
