"""The console lines of a finished job (what the job prints at its end), read from its record."""

from __future__ import annotations

from spec_decode.analysis import host, latency
from spec_decode.record.results import FILENAME, PERFORMANCE_ONLY, JobRecord, performance_only
from spec_decode.record.sections import Speedup


def job_summary(rec: JobRecord) -> str:
    """A few console lines for one finished job."""
    m = rec.metrics
    label = (
        f", {PERFORMANCE_ONLY} (accept len forced to {rec.config['spec']['simulate_accept_len']})"
        if performance_only(rec)
        else ""
    )
    lines = [f"[{rec.status}] {rec.label} ({rec.role}, engine={rec.engine.name}{label})"]
    if rec.error:
        lines.append(f"  error: {rec.error}")
    if "throughput_tok_s" in m:
        lines.append(
            f"  throughput {m['throughput_tok_s']:.1f} tok/s  95% CI [{m['throughput_tok_s_ci95_lo']:.1f}, "
            f"{m['throughput_tok_s_ci95_hi']:.1f}]  CV {100 * m['throughput_tok_s_cv']:.1f}%  "
            f"({len(rec.runs)} runs)"
        )
    if "accept_len" in m:
        lines.append(
            f"  accept len {m['accept_len']:.2f}  draft accept rate {m.get('accept_rate_draft', float('nan')):.2f}"
        )
    acc = rec.acceptance
    if acc is not None and acc.per_position:
        lines.append(
            "  acceptance by draft position "
            + " ".join("-" if r is None else f"{r:.2f}" for r in acc.per_position)
            + f" ({acc.source})"
            + (
                ""
                if acc.accept_len_weighted is None
                else f"; accept len per request: {acc.accept_len_weighted:.2f} weighted by verifies, "
                f"{acc.accept_len_unweighted:.2f} unweighted"
            )
        )
    if "cycle_ms" in m:
        lines.append(
            f"  cycle {m['cycle_ms']:.2f} ms = draft {m['draft_ms']:.2f} ({m['draft_pct']:.0f}%) + verify "
            f"{m['verify_ms']:.2f} ({m['verify_pct']:.0f}%) + re-extend {m['extend_ms']:.2f} "
            f"({m['extend_pct']:.0f}%) + other {m['other_ms']:.2f} ({m['other_pct']:.0f}%)"
        )
    if "speedup_vs_baseline" in m:
        sp = rec.speedup_vs_baseline or Speedup()
        how = (
            f"paired: {sp.pairs} {sp.pairing or 'interleaved'} pairs, baseline "
            f"{m['baseline_throughput_tok_s']:.1f} tok/s"
            if sp.how == "paired"
            else "vs a separate baseline job"
        )
        lines.append(
            f"  speedup vs baseline {m['speedup_vs_baseline']:.3f}x  95% CI "
            f"[{m['speedup_vs_baseline_ci95_lo']:.3f}, {m['speedup_vs_baseline_ci95_hi']:.3f}] "
            f"(+-{m['speedup_ci95_halfwidth_pct']:.1f}%; {how})"
        )
    lines += latency.describe(rec.latency)  # streamed runs only
    lines += [f"  {said}" for b in (False, True) if (said := host.describe_server_cpu(m, baseline=b))]
    for c in rec.checks:
        if c.ok is False:
            lines.append(f"  CHECK FAILED {c.name}: {c.message}")
    for w in rec.warnings:
        lines.append(f"  warning: {w}")
    if rec.drift is not None and rec.drift.note and not rec.drift.message:
        lines.append(f"  drift guard: {rec.drift.note}")
    lines.append(f"  -> {rec.out_dir}/{FILENAME}")
    return "\n".join(lines)
