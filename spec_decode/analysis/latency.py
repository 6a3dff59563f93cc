"""Token-level latency of streamed requests: TTFT, ITL, TPOT, E2E percentiles (pure functions).

Per request (``client.RunRecord`` of a streamed call, all on the client's clock):
- TTFT  = send -> first chunk with >= 1 token (``ttft_s``);
- ITL   = each token's gap after the previous one (``token_gaps_s``: a chunk of n tokens after a gap g
          counts n gaps of g/n -- the spreading rule, ``client`` module doc); pooled over the requests;
- TPOT  = (E2E - TTFT) / (completion_tokens - 1): one value per request;
- E2E   = send -> end of the stream (``wall_s``).
Percentiles interpolate linearly between order statistics (numpy's default), with ``n`` beside them:
P99 of 5 TTFTs is the largest but a bit, not a tail estimate.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

from spec_decode.record.sections import Distribution, Latency

PERCENTILES = (50, 90, 99)
KINDS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> Distribution:
    """p50, p90, p99, mean, n."""
    p50, p90, p99 = (percentile(values, q) for q in PERCENTILES)
    return Distribution(p50, p90, p99, statistics.fmean(values), len(values))


def samples(runs: Iterable) -> dict[str, list[float]]:
    """The latency samples (ms) of the streamed runs: one TTFT/TPOT/E2E per request, one ITL per token."""
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in runs:
        if not getattr(r, "stream", False) or r.ttft_s is None:
            continue
        out["ttft_ms"].append(1e3 * r.ttft_s)
        out["e2e_ms"].append(1e3 * r.wall_s)
        out["itl_ms"] += [1e3 * g for g in r.token_gaps_s or []]
        if r.completion_tokens > 1:
            out["tpot_ms"].append(1e3 * (r.wall_s - r.ttft_s) / (r.completion_tokens - 1))
    return out


def summarize(runs: Iterable) -> Latency:
    """The job's ``latency`` section: a ``Distribution`` per kind (ttft_ms, itl_ms, tpot_ms, e2e_ms) that
    a run measured; no kind when no run streamed."""
    return Latency(**{k: distribution(v) for k, v in samples(runs).items() if v})


def metrics_of(latency: Latency | None) -> dict[str, float]:
    """Flat metrics: ``ttft_ms_p50`` ... ``e2e_ms_p99``."""
    kinds = latency.kinds() if latency is not None else {}
    return {f"{k}_p{q}": getattr(d, f"p{q}") for k, d in kinds.items() for q in PERCENTILES}


TAIL_MIN_N = 100  # below this many samples P99 is about the largest value, not a tail estimate


def describe(lat: Latency | None) -> list[str]:
    """Console lines for a streamed job: TTFT, ITL, TPOT at P50/P90/P99 with the sample count."""
    lines = []
    for d, name in ((lat.ttft_ms, "TTFT"), (lat.itl_ms, "ITL"), (lat.tpot_ms, "TPOT")) if lat is not None else ():
        if d:
            lines.append(
                f"  {name:<4} P50 {d.p50:.2f}  P90 {d.p90:.2f}  P99 {d.p99:.2f} ms  (n={int(d.n)}"
                + (f"; P99 of {int(d.n)} samples is near the maximum, not a tail)" if d.n < TAIL_MIN_N else ")")
            )
    return lines
