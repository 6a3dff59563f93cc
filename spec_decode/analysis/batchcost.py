"""The cost model against the batch size (issue 28): the effective time of one decode step of the whole
running batch per arm, a nonnegative line in the batch, and where speculation stops (or starts) paying.
The phase model (spec_decode.analysis.costmodel) is fitted at batch 1 and cannot see the batch."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from spec_decode.analysis.costmodel import nonneg_line
from spec_decode.record.results import performance_only

if TYPE_CHECKING:
    from spec_decode.record.results import JobRecord

# The phase model (costmodel) is fitted on the profiled pass, which runs at batch 1: it cannot see the batch.
# Under load the records carry the engine's running batch (decode log) and the aggregate tok/s, from
# which the effective time of one decode step of the whole batch follows: T(b) = b x L / tok/s (L = accept
# length; 1 for the baseline). A line T(b) = a + s x b per arm (nonnegative, like the phases) is what the
# model learns: s is the cost of one more request in the batch; speculation pays while L x T_base(b) > T_k(b).
BATCH_LABEL = (
    "step time from the aggregate tok/s x running batch / accept length (prefill, HTTP and the "
    "run's ramp included), not from the phase profiler"
)


def batch_points(recs: list[JobRecord]) -> dict[str, list[tuple[float, float]]]:
    """arm ('baseline' or 'steps=k') -> [(running batch, step ms)] of finished, not performance-only records.
    The batch is the engine's median #running-req where the record has it (the load protocol), else 1 for
    the one-request protocol (concurrency 1); other records without it are left out."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in recs:
        m = r.metrics
        if r.status != "FINISHED" or not m.get("throughput_tok_s") or performance_only(r):
            continue
        conc = (r.config.get("benchmark") or {}).get("concurrency", 1)
        batch = m.get("running_req_median", 1.0 if conc == 1 else None)
        accept = m.get("accept_len") if r.speculative else 1.0
        if batch is None or accept is None:
            continue
        arm = f"steps={r.steps}" if r.speculative else "baseline"
        out.setdefault(arm, []).append((float(batch), 1e3 * batch * accept / m["throughput_tok_s"]))
        paired = r.load.paired_baseline if r.load else None
        base_batch = (paired and paired.running and paired.running.running_median) or (
            1.0 if conc == 1 and r.speculative else None
        )
        is_paired = r.speedup_vs_baseline is not None and r.speedup_vs_baseline.method == "paired"
        if r.speculative and is_paired and m.get("baseline_throughput_tok_s") and base_batch:
            # the paired baseline server beside this job (the default strategy: no baseline job), at the
            # same concurrency; its own running batch from its decode log
            out.setdefault("baseline", []).append(
                (float(base_batch), 1e3 * base_batch / m["baseline_throughput_tok_s"])
            )
    return out


def batch_model(recs: list[JobRecord]) -> dict:
    """``{"learned": bool, "why": str, "label": str, "arms": {arm: {fixed_ms, per_request_ms, r2, batches}},
    "crossover_batch": {arm: batch where L x T_base = T_k, or None}}``. Learned only when the baseline and
    at least one step count each have two or more distinct running-batch sizes; else it says why."""
    pts = batch_points(recs)
    arms = {}
    for arm, xy in sorted(pts.items()):
        bs = sorted({b for b, _ in xy})
        if len(bs) < 2:
            continue
        a, s, q = nonneg_line([b for b, _ in xy], [t for _, t in xy])
        arms[arm] = {"fixed_ms": a, "per_request_ms": s, "r2": q["r2"], "batches": bs}
    if "baseline" not in arms or len(arms) < 2:
        have = {arm: sorted({b for b, _ in xy}) for arm, xy in pts.items()}
        return {
            "learned": False,
            "label": BATCH_LABEL,
            "arms": arms,
            "crossover_batch": {},
            "why": (
                "cannot learn the batch size: it needs the baseline and a step count each measured at 2 or "
                f"more running-batch sizes (benchmark.concurrency swept with the load protocol); have {have}"
            ),
        }
    base = arms["baseline"]
    cross = {}
    for arm, f in arms.items():
        if arm == "baseline":
            continue
        accept = statistics.fmean(
            r.metrics["accept_len"]
            for r in recs
            if r.speculative and f"steps={r.steps}" == arm and "accept_len" in r.metrics
        )
        denom = accept * base["per_request_ms"] - f["per_request_ms"]
        num = f["fixed_ms"] - accept * base["fixed_ms"]
        cross[arm] = _break_even(num, denom)
        f["accept_len"] = accept
    return {"learned": True, "why": "", "label": BATCH_LABEL, "arms": arms, "crossover_batch": cross}


def _break_even(num: float, denom: float) -> str:
    """Where L x T_base(b) = T_k(b): speculation pays where denom x b > num (b >= 1)."""
    if denom == 0:
        return "pays at every batch" if num < 0 else "pays at no batch"
    b = num / denom
    if denom < 0:
        return "pays at no batch" if b <= 1 else f"pays below batch {b:.1f}"
    return "pays at every batch" if b <= 1 else f"pays above batch {b:.1f}"


def describe_batch(model: dict) -> str:
    if not model["learned"]:
        return f"cost model vs batch size: {model['why']}"
    lines = [f"cost model vs batch size ({model['label']}):"]
    for arm, f in model["arms"].items():
        x = model["crossover_batch"].get(arm)
        extra = "" if arm == "baseline" else (f"; accept len {f['accept_len']:.2f}; by these lines speculation {x}")
        r2 = "-" if f["r2"] is None else f"{f['r2']:.2f}"
        lines.append(
            f"  {arm}: step = {f['fixed_ms']:.2f} + {f['per_request_ms']:.3f} x batch ms (R^2 {r2}, "
            f"batches {', '.join(f'{b:g}' for b in f['batches'])}){extra}"
        )
    return "\n".join(lines)
