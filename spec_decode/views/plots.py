"""The sweep's PNG plots (throughput, speedup, phases, acceptance, concurrency) and the cost-model fits
they draw, from job records; report renders the tables and calls write_plots."""

from __future__ import annotations

from pathlib import Path

from spec_decode.analysis import blocks, concurrency
from spec_decode.analysis.costmodel import fit, points_from_records
from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record.results import JobRecord
from spec_decode.views.charts import acceptance_figures, concurrency_figures, legend_outside, save


def cost_models(recs: list[JobRecord]) -> dict:
    """A cost-model fit per NCCL profile (and concurrency, never mixing two) with >= 2 measured step counts."""
    out = {}
    for prof in sorted({r.choice("nccl") for r in recs if r.speculative}):
        for c in sorted({concurrency.concurrency_of(r) for r in recs}):
            pts = points_from_records([r for r in recs if concurrency.concurrency_of(r) == c], nccl=prof)
            if len(pts) >= 2:
                out[prof if not concurrency.swept(recs) else f"{prof}, concurrency={c}"] = fit(
                    pts, max_steps=max(8, max(p.steps for p in pts))
                )
    return out


def write_plots(recs: list[JobRecord], out_dir: Path) -> list[Path]:
    """throughput_vs_steps.png, speedup_vs_steps.png, phases.png, accept_len_vs_steps.png (each always:
    a "no data" figure where this sweep has none), acceptance_histogram.png, accept_rate_by_position.png
    and the concurrency plots (those that have data). A block-design sweep is plotted by cell (its
    blocks folded, spec_decode.analysis.blocks), one point per cell."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = blocks.cells(recs)
    figs = {**figures(cells), **concurrency_figures(cells)}
    # The four that the report stage declares as DVC outs always exist: one this sweep has no data for
    # (phases.png without a profiled pass) is a figure that says so, never an earlier sweep's plot left
    # behind beside new numbers, nor a missing out that stops `dvc repro`.
    for name in ALWAYS:
        if name not in figs:  # not setdefault: that would draw (and leave open) a figure for every name
            figs[name] = _no_data(name)
    return [save(fig, out_dir / name) for name, fig in figs.items()]


ALWAYS = ("throughput_vs_steps.png", "speedup_vs_steps.png", "phases.png", "accept_len_vs_steps.png")
_WHY = {"phases.png": "no phase times in this sweep (no profiled pass: benchmark.profile=false?)"}


def _no_data(name: str):
    """A figure that says this sweep has no data for `name`."""
    with frozen_imports():  # lazy: as in figures()
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 1.6))
    ax.axis("off")
    ax.text(
        0.5,
        0.5,
        f"{name}: {_WHY.get(name, 'no finished speculative job with this data in this sweep')}",
        ha="center",
        va="center",
        fontsize=9,
        wrap=True,
    )
    fig.suptitle("no data", fontsize=10)
    return fig


def figures(recs: list[JobRecord]) -> dict:
    """The report's matplotlib figures by file name (those that have data)."""
    with frozen_imports():  # lazy: plotting costs ~1 s of start-up; most report calls print tables only
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

    done = [r for r in recs if r.status == "FINISHED" and r.metrics]
    spec = [r for r in done if r.speculative and "throughput_tok_s" in r.metrics]
    base = [r for r in done if not r.speculative and "throughput_tok_s" in r.metrics]
    out: dict = {}
    if spec:
        profiles = sorted({r.choice("nccl") for r in spec})
        colors = {prof: f"C{i}" for i, prof in enumerate(profiles)}  # one colour per series, every plot
        fits = cost_models(spec)
        fig, ax = plt.subplots(figsize=(8.5, 4.5))
        for prof in profiles:
            pts = sorted(((r.steps, r.metrics) for r in spec if r.choice("nccl") == prof), key=lambda p: p[0])
            xs = [p[0] for p in pts]
            ys = [p[1]["throughput_tok_s"] for p in pts]
            err = [
                [y - p[1].get("throughput_tok_s_ci95_lo", y) for y, p in zip(ys, pts)],
                [p[1].get("throughput_tok_s_ci95_hi", y) - y for y, p in zip(ys, pts)],
            ]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, color=colors[prof], label=f"EAGLE-3, nccl={prof}")
            for b in base:
                if b.choice("nccl") == prof:
                    ax.axhline(
                        b.metrics["throughput_tok_s"], ls="--", lw=1, color=colors[prof], label=f"baseline, nccl={prof}"
                    )
                    break
            if prof in fits:  # the model's curve, in the series' colour, one step beyond what was measured
                f = fits[prof]
                pred = [p for p in f.predictions if p["steps"] <= max(xs) + 1]
                ax.plot(
                    [p["steps"] for p in pred],
                    [p["predicted_tok_s"] for p in pred],
                    ls=":",
                    marker="x",
                    color=colors[prof],
                    label=f"cost model, nccl={prof} (best within measured steps: "
                    f"{f.best_steps}"
                    + (f"; {f.best_outside['steps']} by EXTRAPOLATION, not measured)" if f.best_outside else ")"),
                )
        ax.set_xlabel("speculative steps (draft tokens per cycle)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("throughput (tok/s), mean with 95% CI")
        ax.set_title(f"Throughput vs steps ({spec[0].engine.name} engine, {spec[0].choice('hardware')})")
        ax.grid(alpha=0.3)
        legend_outside(ax)
        out["throughput_vs_steps.png"] = fig

        withs = [r for r in spec if "speedup_vs_baseline" in r.metrics]
        if withs:
            fig, ax = plt.subplots(figsize=(8.5, 4.5))
            offsets = {prof: 0.08 * (i - (len(profiles) - 1) / 2) for i, prof in enumerate(profiles)}
            for prof in profiles:
                pts = sorted((r for r in withs if r.choice("nccl") == prof), key=lambda r: r.steps)
                if not pts:
                    continue
                xs = [r.steps + offsets[prof] for r in pts]  # side by side, not on top of each other
                ys = [r.metrics["speedup_vs_baseline"] for r in pts]
                err = [
                    [y - r.metrics.get("speedup_vs_baseline_ci95_lo", y) for y, r in zip(ys, pts)],
                    [r.metrics.get("speedup_vs_baseline_ci95_hi", y) - y for y, r in zip(ys, pts)],
                ]
                methods = sorted({r.speedup_vs_baseline.how if r.speedup_vs_baseline else "welch" for r in pts})
                ax.errorbar(
                    xs,
                    ys,
                    yerr=err,
                    marker="o",
                    capsize=4,
                    ls="-",
                    color=colors[prof],
                    label=f"nccl={prof} ({'/'.join(methods)} 95% CI)",
                )
            ax.axhline(1.0, color="grey", lw=1, ls="--", label="no speedup")
            ax.set_xlabel("speculative steps")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("speedup vs baseline (x), 95% CI")
            ax.set_title("Speedup vs steps")
            ax.grid(alpha=0.3)
            legend_outside(ax)
            out["speedup_vs_steps.png"] = fig

        fig, ax = plt.subplots(figsize=(8.5, 4.5))
        pts = sorted(((r.steps, r.choice("nccl")), r.metrics["accept_len"]) for r in spec if "accept_len" in r.metrics)
        styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
        for i, prof in enumerate(sorted({p[0][1] for p in pts})):
            sel = [(k[0], v) for k, v in pts if k[1] == prof]
            marker, ls = styles[i % len(styles)]
            ax.plot(
                [s for s, _ in sel], [v for _, v in sel], marker=marker, ls=ls, color=colors[prof], label=f"nccl={prof}"
            )
        if pts:
            top = max(p[0][0] for p in pts)
            ax.plot([1, top], [2, top + 1], ls=":", color="grey", label="ideal (all drafts accepted)")
        ax.set_xlabel("speculative steps")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("accept length (tokens per verify, incl. bonus)")
        ax.set_title("Acceptance vs steps")
        ax.grid(alpha=0.3)
        legend_outside(ax)
        out["accept_len_vs_steps.png"] = fig

        prof = sorted((r for r in spec if "cycle_ms" in r.metrics), key=lambda r: (r.steps, r.choice("nccl") or ""))
        if prof:
            fig, ax = plt.subplots(figsize=(max(7.5, 0.9 * len(prof) + 2.5), 4.5))
            labels = [_bar_label(r, prof) for r in prof]
            bottom = [0.0] * len(prof)
            for phase, label in (
                ("draft", "draft"),
                ("verify", "target verify"),
                ("extend", "draft re-extend"),
                ("other", "other"),
            ):
                vals = [r.metrics[f"{phase}_ms"] for r in prof]
                ax.bar(range(len(prof)), vals, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_xticks(range(len(prof)), labels, fontsize=8)
            ax.set_ylabel("ms per speculative cycle")
            ax.set_title("Where each cycle's time goes")
            legend_outside(ax)
            out["phases.png"] = fig
    out.update(acceptance_figures(spec, cost_models(spec) if spec else {}))
    return out


def _bar_label(rec: JobRecord, group: list[JobRecord]) -> str:
    """A phase bar's label: steps and NCCL profile, plus what else tells jobs of the group apart."""
    label = f"steps={rec.steps}\nnccl={rec.choice('nccl')}"
    twins = [r for r in group if r.steps == rec.steps and r.choice("nccl") == rec.choice("nccl")]
    if len(twins) > 1:  # e.g. a prompt sweep: the job's own overrides tell them apart
        rest = [p for p in rec.label.split(",") if "=" in p and not p.startswith(("spec.steps", "nccl="))]
        label += "\n" + _short(" ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in (p.split("=", 1) for p in rest)), 20)
    return label


def _short(label: str, n: int = 32) -> str:
    """Axis labels: the job's distinguishing overrides, cut to fit."""
    parts = [
        p
        for p in label.split(",")
        if not p.startswith(("tracking.", "hydra.", "benchmark.max_new", "benchmark.runs", "benchmark.warmup"))
    ]
    text = ",".join(parts) or label
    return text if len(text) <= n else text[: n - 1] + "~"
