"""Speedup against load (issue 28): per step count, the speedup at each concurrency with its interval,
the concurrency where speculation stops paying, and the step count to run at each concurrency.

- ``curves``: per (NCCL profile, steps), one point per ``benchmark.concurrency``: the job's speedup
  against the baseline at the same concurrency (paired or Welch, as measured) with its 95% interval
  (the record's; over blocks where the sweep ran a block design).
- ``crossover``: the concurrency where the speedup falls below 1, read on a log2 concurrency axis
  between the last measured point at or above 1 and the first below it (linear interpolation). Its
  interval comes from the same reading of the pointwise 95% bounds: the lower end where the *lower*
  bound first falls below 1 (from there on speculation may no longer pay), the upper end where the
  *upper* bound does (from there on it surely does not). Not reached = the speedup stays >= 1 up to the
  largest measured concurrency (the interval's lower end is still given when the lower bound dips).
- ``recommend_per_concurrency``: ``analysis.recommend`` on each concurrency's jobs alone (its
  stability and overlap rules: it may say "cannot decide").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from spec_decode.analysis import recommend

if TYPE_CHECKING:
    from spec_decode.record.results import JobRecord


def concurrency_of(rec: JobRecord) -> int:
    return int((rec.config.get("benchmark") or {}).get("concurrency", 1) or 1)


def swept(recs: list[JobRecord]) -> bool:
    """Whether the records span more than one concurrency (the concurrency views apply)."""
    return len({concurrency_of(r) for r in recs}) > 1


def curves(recs: list[JobRecord]) -> dict[tuple[str, int], list[dict]]:
    """(nccl, steps) -> [{concurrency, speedup, lo, hi, job}] ascending in concurrency."""
    out: dict[tuple[str, int], list[dict]] = {}
    for r in recs:
        m = r.metrics
        if r.status != "FINISHED" or not r.speculative or "speedup_vs_baseline" not in m:
            continue
        out.setdefault((r.choice("nccl") or "", r.steps or 0), []).append(
            {
                "concurrency": concurrency_of(r),
                "speedup": m["speedup_vs_baseline"],
                "lo": m.get("speedup_vs_baseline_ci95_lo", m["speedup_vs_baseline"]),
                "hi": m.get("speedup_vs_baseline_ci95_hi", m["speedup_vs_baseline"]),
                "job": r.label,
            }
        )
    return {k: sorted(v, key=lambda p: p["concurrency"]) for k, v in sorted(out.items())}


def _crossing(cs: list[int], ys: list[float]) -> tuple[float | None, str]:
    """Where ys first falls below 1 (log2-interpolated in cs); None when it never does."""
    for i, y in enumerate(ys):
        if y < 1:
            if i == 0:
                return float(cs[0]), "at or below"
            x0, x1 = math.log2(cs[i - 1]), math.log2(cs[i])
            t = (ys[i - 1] - 1) / (ys[i - 1] - y)
            return 2 ** (x0 + t * (x1 - x0)), "at"
    return None, "not reached"


def crossover(points: list[dict]) -> dict:
    """The crossover concurrency of one curve with its interval (module doc)."""
    cs = [p["concurrency"] for p in points]
    point, how = _crossing(cs, [p["speedup"] for p in points])
    lo, lo_how = _crossing(cs, [p["lo"] for p in points])
    hi, hi_how = _crossing(cs, [p["hi"] for p in points])
    # a curve that pays again at a higher concurrency (a baseline that stops scaling, say): where the
    # first point after the crossing has its 95% lower bound above 1
    after = [p for p in points if point is not None and p["concurrency"] > point]
    recovers = next((p["concurrency"] for p in after if p["lo"] > 1), None)
    return {
        "concurrency": point,
        "recovers": recovers,
        "how": how,
        "lo": lo,
        "lo_how": lo_how,
        "hi": hi,
        "hi_how": hi_how,
        "measured": cs,
        "reached": point is not None,
    }


def describe_crossover(x: dict) -> str:
    top = max(x["measured"])
    lo = "-" if x["lo"] is None else f"{x['lo']:.1f}"
    hi = f"> {top}" if x["hi"] is None else f"{x['hi']:.1f}"
    if not x["reached"]:
        tail = f" (the 95% lower bound falls below 1 from concurrency {lo})" if x["lo"] is not None else ""
        return f"not reached: speedup >= 1 up to concurrency {top}{tail}"
    where = f"<= {x['concurrency']:.0f}" if x["how"] == "at or below" else f"{x['concurrency']:.1f}"
    again = f"; above 1 again from concurrency {x['recovers']} (95% lower bound > 1)" if x.get("recovers") else ""
    return f"{where}, 95% interval [{lo}, {hi}]{again}"


def recommend_per_concurrency(recs: list[JobRecord]) -> dict[int, recommend.Recommendation | None]:
    """The step recommendation among each concurrency's jobs alone."""
    groups: dict[int, list[JobRecord]] = {}
    for r in recs:
        groups.setdefault(concurrency_of(r), []).append(r)
    return {c: recommend.recommend(g) for c, g in sorted(groups.items())}


def describe(recs: list[JobRecord]) -> list[str]:
    """The report's lines: speedup by concurrency per step count, crossovers, recommendation per concurrency."""
    cur = curves(recs)
    if not cur:
        return []
    cs = sorted({p["concurrency"] for pts in cur.values() for p in pts})
    profiles = {k[0] for k in cur}
    lines = [
        "speedup vs baseline at the same concurrency (95% CI), by concurrency:",
        "  series" + "".join(f"  {'c=' + str(c):>24}" for c in cs) + "  crossover (speedup < 1)",
    ]
    for (nccl, steps), pts in cur.items():
        at = {p["concurrency"]: p for p in pts}
        name = f"steps={steps}" + (f" nccl={nccl}" if len(profiles) > 1 else "")
        cells = "".join(f"  {format_point(at[c]) if c in at else '-':>24}" for c in cs)
        lines.append(f"  {name}{cells}  {describe_crossover(crossover(pts))}")
    lines.append("recommended step count per concurrency (analysis.recommend on each concurrency's jobs):")
    for c, rec in recommend_per_concurrency(recs).items():
        if rec is not None:
            head = f"steps={rec.steps}" if rec.decision == "recommend" else "cannot decide"
            lines.append(f"  c={c}: {head} -- {rec.reason}")
    return lines


def format_point(p: dict) -> str:
    return f"{p['speedup']:.2f} [{p['lo']:.2f}, {p['hi']:.2f}]"
