"""The step-count recommendation of a sweep, refusing noisy cells (issue 21). Pure: job records in,
a ``Recommendation`` out; ``report.sweep_summary`` prints it, the sweep's parent MLflow run keeps it.

1. **Stability per cell** (a cell = one speculative job: its step count x NCCL profile x whatever
   else its overrides set). The dispersion of its runs' tok/s: the robust CV, 1.4826 x MAD / median
   (``stats.robust_cv``: for normal noise it estimates the CV; one run of five hit by a neighbour's
   burst does not move it); the plain CV for records written before the robust CV was kept.
   A cell is stable when the dispersion is at most ``STABLE_MAX`` (5%) and it has at least
   ``MIN_RUNS`` runs.

   Why 5%: with 5 runs per arm a two-sample t-test detects differences of about 2 x CV
   (``stats.min_detectable_effect``); at CV 5% that is ~10%, the size of the gaps between adjacent
   step counts measured on the embedded engine (1 -> 2 -> 3 steps: +15..30% each; 3 vs 5: ~10%). A
   noisier cell cannot tell its neighbours apart, so its mean is not evidence. (``stats.CV_WARN``,
   3%, is the stricter bar for resolving the ~6% effects NCCL tuning is after.)
2. **Score** (conservative): the lower bound of the 95% CI of the speedup vs the baseline where every
   competing cell has one (a paired speedup cancels the host drift both arms of a pair share), else of
   the tok/s. Only stable cells compete; performance-only records (forced acceptance,
   ``spec.simulate_accept_len``) are labelled and never compete: their acceptance is not the drafter's;
   nor do cells whose lossless check failed (their outputs are not plain decoding's). A cell of fewer
   than ``MIN_RUNS`` runs has no score: its interval (1 df: mean +- 9 std for 2 runs) is noise.
3. **Decision.** The best score wins unless its CI overlaps that of any other competing cell (the
   data cannot tell them apart) or no cell is stable: then "cannot decide", with the reason. A noisy
   cell does not compete, but it is no evidence against itself either: where its interval reaches the
   best's lower bound (or it has none), it could be the better choice, and a pick among the stable
   cells (1 of 8 on a loaded CPU, issue 44) answers nothing -- "cannot decide", naming it.
   Where no cell competes and some have fewer than ``MIN_RUNS`` runs, the reason counts them apart
   (their spread is unknown, not large) and names ``benchmark.runs`` (``benchmark.blocks`` for block means).
4. **The A/A control** (issue 25, ``spec_decode.analysis.control``): when two cells known to measure the
   same thing have disjoint 95% intervals, the machine's noise exceeds the stated intervals and no
   score above can be trusted: "cannot decide", whatever the ranking says.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from spec_decode.analysis import control
from spec_decode.record.results import JobRecord, performance_only

STABLE_MAX = 0.05  # robust CV (or CV) of a cell's runs' tok/s; why 5%: see the module doc
MIN_RUNS = control.MIN_RUNS  # a MAD or a CV of 2 runs says nothing about the spread


@dataclass
class CellVerdict:
    cell: str  # the job's label
    steps: int | None
    nccl: str | None
    n: int
    dispersion: float | None  # robust CV or CV (a fraction)
    measure: str  # "robust CV" | "CV"
    stable: bool
    performance_only: bool
    competes: bool
    reason: str  # why it does or does not compete
    score: float | None = None  # the CI's lower bound (of score_name)
    score_hi: float | None = None
    value: float | None = None  # the estimate (speedup or tok/s)
    lossless_failed: bool = False


@dataclass
class Recommendation:
    decision: str  # "recommend" | "cannot decide"
    cell: str | None  # the recommended job's label
    steps: int | None
    reason: str
    score_name: str  # "speedup_vs_baseline" | "throughput_tok_s" (its 95% CI lower bound)
    threshold: float = STABLE_MAX
    verdicts: list[CellVerdict] = field(default_factory=list)
    control: str = "none"  # the A/A control's status: ok | disagree | none

    def as_dict(self) -> dict:
        return asdict(self)


def dispersion(rec: JobRecord) -> tuple[float | None, str, int]:
    """(robust CV, or the CV where the record predates it, of the runs' tok/s; which one; runs)."""
    m = rec.metrics
    n = int((rec.throughput_tok_s and rec.throughput_tok_s.n) or len(rec.runs))
    if "throughput_tok_s_robust_cv" in m:
        return m["throughput_tok_s_robust_cv"], "robust CV", n
    return m.get("throughput_tok_s_cv"), "CV", n


def verdict(rec: JobRecord, threshold: float = STABLE_MAX) -> CellVerdict:
    disp, measure, n = dispersion(rec)
    perf = performance_only(rec)
    if n < MIN_RUNS:
        stable, why = False, f"noisy: unknown spread with {n} run(s) (< {MIN_RUNS})"
    elif disp is None:
        stable, why = False, "noisy: no spread recorded"
    elif disp > threshold:
        stable, why = False, f"noisy: {measure} {100 * disp:.1f}% > {100 * threshold:.0f}% over {n} runs"
    else:
        stable, why = True, f"stable: {measure} {100 * disp:.1f}% <= {100 * threshold:.0f}% over {n} runs"
    lossless = rec.lossless.verdict if rec.lossless is not None else None
    if lossless == "fail":
        why = "lossless check failed (outputs differ from plain decoding); " + why
    if perf:
        why = "performance-only (forced acceptance): not a drafter choice; " + why
    return CellVerdict(
        rec.label,
        rec.steps,
        rec.choice("nccl"),
        n,
        disp,
        measure,
        stable,
        perf,
        stable and not perf and lossless != "fail",
        why,
        lossless_failed=lossless == "fail",
    )


def recommend(recs: list[JobRecord], threshold: float = STABLE_MAX) -> Recommendation | None:
    """The recommendation over a sweep's finished speculative jobs; None without any."""
    spec = [r for r in recs if r.speculative and r.status == "FINISHED" and "throughput_tok_s" in r.metrics]
    if not spec:
        return None
    verdicts = {r.label: verdict(r, threshold) for r in spec}
    competing = [r for r in spec if verdicts[r.label].competes]
    by_speedup = bool(competing) and all("speedup_vs_baseline_ci95_lo" in r.metrics for r in competing)
    name = "speedup_vs_baseline" if by_speedup else "throughput_tok_s"
    for r in spec:
        v = verdicts[r.label]
        # a cell of fewer runs gets no score: its interval (1 df: t = 12.7) is noise, not a bound
        if f"{name}_ci95_lo" in r.metrics and v.n >= MIN_RUNS and math.isfinite(r.metrics[f"{name}_ci95_lo"]):
            v.value, v.score, v.score_hi = (r.metrics[name], r.metrics[f"{name}_ci95_lo"], r.metrics[f"{name}_ci95_hi"])
    out = Recommendation("cannot decide", None, None, "", name, threshold, list(verdicts.values()))
    ranked = sorted(
        (verdicts[r.label] for r in competing if verdicts[r.label].score is not None),
        key=lambda v: v.score,
        reverse=True,
    )
    fmt = ".3f" if by_speedup else ".1f"
    aa = control.check(recs)
    out.control = aa.status
    if aa.status == "disagree":  # refuse: the intervals the ranking rests on are not honest here
        out.reason = f"refused: {aa.message}"
        return out
    if not ranked:
        out.reason = no_stable_cell(list(verdicts.values()), threshold, any(_blocks(r) for r in spec))
        return out
    best = ranked[0]
    # The rival is the other competing cell whose CI reaches highest (not the second-best lower bound:
    # a wide CI below it can still overlap the best's).
    # ... and not the best's A/A twin: known to measure the same thing, it overlaps by design
    twins = {frozenset((a.label, b.label)) for a, b, _ in control.pairs(recs)}
    rivals = [v for v in ranked[1:] if frozenset((best.cell, v.cell)) not in twins]
    rival = max(rivals, key=lambda v: v.score_hi) if rivals else None
    if rival is not None and rival.score_hi >= best.score:
        out.reason = (
            f"the best and another stable cell overlap: {best.cell} {name} 95% CI "
            f"[{best.score:{fmt}}, {best.score_hi:{fmt}}] vs {rival.cell} "
            f"[{rival.score:{fmt}}, {rival.score_hi:{fmt}}]"
        )
        return out
    unsure = [
        v
        for v in verdicts.values()
        if v.cell != best.cell
        and not (v.stable or v.performance_only or v.lossless_failed)
        and frozenset((best.cell, v.cell)) not in twins
        and (v.score_hi is None or v.score_hi >= best.score)
    ]
    if unsure:  # a noisy cell that could be better: the stable ones alone do not answer the question
        top = max(unsure, key=lambda v: float("inf") if v.score_hi is None else v.score_hi)
        theirs = "no interval" if top.score is None else f"[{top.score:{fmt}}, {top.score_hi:{fmt}}]"
        out.reason = (
            f"{len(ranked)} of {len(verdicts)} cell(s) compete, and {len(unsure)} noisy cell(s) could be "
            f"better than the best of them: {best.cell} {name} 95% CI [{best.score:{fmt}}, {best.score_hi:{fmt}}] "
            f"vs {top.cell} {theirs} (noisy); rerun with more runs (benchmark.runs) or on a quieter machine"
        )
        return out
    out.decision, out.cell, out.steps = "recommend", best.cell, best.steps
    beaten = (
        f"; its CI lies above every other competing cell's (highest upper bound: {rival.cell} {rival.score_hi:{fmt}})"
        if rival is not None
        else "; the only competing cell"
    )
    out.reason = f"highest {name} 95% CI lower bound {best.score:{fmt}} among {len(ranked)} competing cell(s){beaten}"
    return out


def _blocks(rec: JobRecord) -> bool:
    """A cell folded over its blocks (analysis.blocks): its n counts blocks, not runs."""
    return rec.throughput_tok_s is not None and rec.throughput_tok_s.unit == "block means"


def no_stable_cell(verdicts: list[CellVerdict], threshold: float, blocks: bool) -> str:
    """Why no cell competes. Cells of fewer than MIN_RUNS runs are named apart: their spread is unknown,
    not large, and the knob that fixes it is benchmark.runs (benchmark.blocks for block means)."""
    few = [v for v in verdicts if v.n < MIN_RUNS]
    noisy = sum(not v.stable for v in verdicts) - len(few)
    perf = sum(v.performance_only for v in verdicts)
    lossy = sum(v.stable and not v.performance_only and not v.competes for v in verdicts)
    parts = []
    if few:
        counts = " or ".join(str(n) for n in sorted({v.n for v in few}))
        unit = "block(s)" if blocks else "run(s)"
        parts.append(f"{len(few)} of {len(verdicts)} noisy: unknown spread with {counts} {unit} (< {MIN_RUNS})")
    if noisy or not few:
        parts.append(f"{noisy} of {len(verdicts)} noisy (> {100 * threshold:.0f}%)")
    if perf:
        parts.append(f"{perf} performance-only")
    if lossy:
        parts.append(f"{lossy} failed the lossless check")
    knob = f"benchmark.blocks={MIN_RUNS}" if blocks else f"benchmark.runs={MIN_RUNS}"
    rerun = f"{knob} or more" + ("" if blocks else " (the protocol's 5)") if few else "more runs"
    return f"no stable cell: {', '.join(parts)}; rerun with {rerun}" + (
        " or on a quieter machine" if noisy or not few else ""
    )


def describe(rec: Recommendation) -> str:
    """A few lines: the decision and every cell's verdict."""
    head = (
        f"recommendation: steps={rec.steps} ({rec.cell})"
        if rec.decision == "recommend"
        else "recommendation: cannot decide"
    )
    lines = [
        f"{head} -- {rec.reason}",
        f"  A/A control: {rec.control}",
        f"  score: the 95% CI lower bound of {rec.score_name}; a cell competes when its runs' spread "
        f"is <= {100 * rec.threshold:.0f}%",
    ]
    for v in sorted(rec.verdicts, key=lambda v: (v.nccl or "", v.steps or 0, v.cell)):
        score = "-" if v.score is None else format(v.score, ".3f" if rec.score_name.startswith("speedup") else ".1f")
        lines.append(f"  {v.cell}: {'competes' if v.competes else 'excluded'}, {v.reason}; score {score}")
    return "\n".join(lines)


def tag(rec: Recommendation) -> str:
    """The one-line form (the sweep's parent run tag ``recommendation``)."""
    head = f"steps={rec.steps} ({rec.cell})" if rec.decision == "recommend" else "cannot decide"
    return f"{head}: {rec.reason}"[:5000]
