"""Charts of a job's acceptance (issue 21), shared by the report (all jobs of a sweep) and the MLflow
child run (its own job): the histogram of accepted drafts per verify and the acceptance rate by draft
position. Read-only views of ``JobRecord.acceptance``; matplotlib (Agg) figures by file name.
"""

from __future__ import annotations

from pathlib import Path

from spec_decode.analysis import concurrency
from spec_decode.analysis.costmodel import fitted_rate
from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record.results import JobRecord, performance_only


def acceptance_figures(recs: list[JobRecord], fits: dict | None = None) -> dict:
    """acceptance_histogram.png (share of verifies by accepted drafts, one bar series per job) and
    accept_rate_by_position.png (measured rate per draft position per job; dotted: the cost model's
    fitted alpha x decay^(i-1) per NCCL profile) for the records that carry a histogram. Given one
    record: that job's two charts (its MLflow child run's artifacts)."""
    with frozen_imports():  # lazy: plotting costs ~1 s of start-up; a sweep without plots never pays it
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

    have = sorted(
        (r for r in recs if r.speculative and r.acceptance and r.acceptance.histogram and sum(r.acceptance.histogram)),
        key=lambda r: (r.choice("nccl") or "", r.steps or 0),
    )
    if not have:
        return {}
    out = {}
    profiles = sorted({r.choice("nccl") for r in have}, key=str)
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    width = 0.8 / len(have)
    for i, r in enumerate(have):
        h = r.acceptance.histogram
        total = sum(h)
        xs = [a - 0.4 + width * (i + 0.5) for a in range(len(h))]
        ax.bar(
            xs,
            [n / total for n in h],
            width=width,
            label=f"{_series(r, have)} ({total} verifies, {r.acceptance.source})",
        )
    ax.set_xlabel("draft tokens accepted in a verify")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of verifies")
    ax.set_title("Accepted drafts per verify" + _perf_note(have))
    ax.grid(alpha=0.3, axis="y")
    legend_outside(ax)
    out["acceptance_histogram.png"] = fig

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for r in have:
        rates = [(i, x) for i, x in enumerate(r.acceptance.per_position or [], start=1) if x is not None]
        if rates:
            ax.plot([i for i, _ in rates], [x for _, x in rates], marker="o", label=_series(r, have))
    for prof, f in (fits or {}).items():
        if prof in profiles:
            depth = max(len(r.acceptance.histogram) - 1 for r in have)
            ax.plot(
                range(1, depth + 1),
                [fitted_rate(f, i) for i in range(1, depth + 1)],
                ls=":",
                color="grey",
                label=f"cost model's fit, nccl={prof}: {f.alpha:.3f} x {f.decay:.3f}^(i-1)",
            )
    ax.set_xlabel("draft position i")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("P(accepted >= i | accepted >= i-1)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance rate by draft position" + _perf_note(have))
    ax.grid(alpha=0.3)
    legend_outside(ax)
    out["accept_rate_by_position.png"] = fig
    return out


def concurrency_figures(recs: list[JobRecord]) -> dict:
    """speedup_vs_concurrency.png (issue 28): per step count, the speedup against the baseline at the same
    concurrency with its 95% CI, on a log2 concurrency axis, the line at 1 and each crossover's interval
    (shaded band, point marked); {} unless the records span two or more concurrencies."""
    if not concurrency.swept(recs) or not (cur := concurrency.curves(recs)):
        return {}
    with frozen_imports():  # lazy: plotting costs ~1 s of start-up; a sweep at one concurrency never pays it
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    profiles = {k[0] for k in cur}
    cs = sorted({p["concurrency"] for pts in cur.values() for p in pts})
    for i, ((nccl, steps), pts) in enumerate(cur.items()):
        color, shift = f"C{i}", 2 ** (0.04 * (i - (len(cur) - 1) / 2))  # side by side on the log axis
        xs = [p["concurrency"] * shift for p in pts]
        ys = [p["speedup"] for p in pts]
        x = concurrency.crossover(pts)
        name = f"steps={steps}" + (f" nccl={nccl}" if len(profiles) > 1 else "")
        ax.errorbar(
            xs,
            ys,
            yerr=[[y - p["lo"] for y, p in zip(ys, pts)], [p["hi"] - y for y, p in zip(ys, pts)]],
            marker="o",
            capsize=4,
            color=color,
            label=f"{name}: crossover {concurrency.describe_crossover(x)}",
        )
        if x["reached"]:
            ax.axvline(x["concurrency"], color=color, ls=":", lw=1)
        if x["lo"] is not None:
            ax.axvspan(x["lo"], x["hi"] if x["hi"] is not None else max(cs), color=color, alpha=0.08)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="speedup 1 (speculation stops paying)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlabel("concurrency (closed-loop clients; the baseline at the same concurrency)")
    ax.set_ylabel("speedup vs baseline, 95% CI")
    ax.set_title(f"Speedup vs concurrency ({recs[0].engine.name} engine, {recs[0].choice('hardware')})")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    return {"speedup_vs_concurrency.png": fig}


def _series(rec: JobRecord, group: list[JobRecord]) -> str:
    label = f"steps={rec.steps}" + (f" nccl={rec.choice('nccl')}" if len({r.choice("nccl") for r in group}) > 1 else "")
    return label + (" [performance-only]" if performance_only(rec) else "")


def _perf_note(recs: list[JobRecord]) -> str:
    return " (performance-only: forced acceptance)" if any(performance_only(r) for r in recs) else ""


# A legend's columns: two where every label is short enough for half the figure's width, else one.
LEGEND_TWO_COLUMNS_MAX_CHARS = 45
LEGEND_ROW_IN = 0.2  # inches the figure grows per legend row (fontsize 8), so the plot keeps its height


def legend_outside(ax) -> None:
    """The legend under the plot, never over the data and never beside it: right of the axes, the cost
    model's long labels took half the figure's width from throughput_vs_steps.png (issue 44). The figure
    grows by the legend's rows and its layout (constrained) keeps the axes the figure's full width.
    Measured series first, then baselines, models."""
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(
        range(len(labels)), key=lambda i: (not labels[i].startswith(("EAGLE", "nccl=", "steps=")), labels[i])
    )
    short = max(map(len, labels), default=0) <= LEGEND_TWO_COLUMNS_MAX_CHARS
    ncols = 2 if short and len(labels) > 1 else 1
    fig = ax.figure
    fig.set_figheight(fig.get_figheight() + LEGEND_ROW_IN * -(-len(labels) // ncols))
    fig.set_layout_engine("constrained")
    fig.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        fontsize=8,
        loc="outside lower center",
        ncols=ncols,
        frameon=False,
    )


def save(fig, path: Path) -> Path:
    if fig.get_layout_engine() is None:  # a legend_outside figure lays itself out (constrained)
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # lazy: as in the figures' makers (matplotlib costs ~1 s of start-up)

    plt.close(fig)
    return path
