"""Reports: a table per sweep and PNG plots, rendered from job records (results.json files, or a
reported experiment's committed metrics.json via ``experiment.records_from_metrics``). Reads only.

    python -m spec_decode.report multirun/2026-11-29/10-00-00_adhoc     # a sweep dir
    python -m spec_decode.report experiments/embedded_steps_nccl          # an experiment dir
    python -m spec_decode.report --mlflow-run <parent run id>             # a sweep logged to MLflow

Plots: throughput vs steps per NCCL profile (95% CI bars, baseline lines); stacked phase bars per
job; accept length vs steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tabulate import tabulate

from .costmodel import describe, fit, points_from_records
from .results import JobRecord, collect

COLUMNS = ("job", "status", "tok/s", "95% CI", "CV%", "speedup", "speedup 95% CI", "accept len",
           "cycle ms", "draft%", "verify%", "extend%", "other%", "checks")


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def row(rec: JobRecord) -> dict:
    m = rec.metrics
    failed = rec.failed_checks
    return {
        "job": rec.label,
        "status": rec.status,
        "tok/s": _fmt(m.get("throughput_tok_s")),
        "95% CI": (f"[{m['throughput_tok_s_ci95_lo']:.1f}, {m['throughput_tok_s_ci95_hi']:.1f}]"
                   if "throughput_tok_s_ci95_lo" in m else "-"),
        "CV%": _fmt(100 * m["throughput_tok_s_cv"] if "throughput_tok_s_cv" in m else None),
        "speedup": _fmt(m.get("speedup_vs_baseline"), ".3f"),
        "speedup 95% CI": (f"[{m['speedup_vs_baseline_ci95_lo']:.3f}, {m['speedup_vs_baseline_ci95_hi']:.3f}]"
                           if "speedup_vs_baseline_ci95_lo" in m else "-"),
        "accept len": _fmt(m.get("accept_len"), ".2f"),
        "cycle ms": _fmt(m.get("cycle_ms"), ".2f"),
        "draft%": _fmt(m.get("draft_pct"), ".0f"),
        "verify%": _fmt(m.get("verify_pct"), ".0f"),
        "extend%": _fmt(m.get("extend_pct"), ".0f"),
        "other%": _fmt(m.get("other_pct"), ".0f"),
        "checks": "-" if not rec.checks else ("ok" if not failed else "FAILED: " + ",".join(failed)),
    }


def sweep_summary(recs: list[JobRecord]) -> tuple[str, dict[str, list]]:
    """A text table (console) and the same as columns (MLflow log_table). Jobs that did not finish
    are counted by status, each with its reason."""
    rows = [row(r) for r in recs]
    lines = [tabulate([[r[c] for c in COLUMNS] for r in rows], headers=COLUMNS, tablefmt="simple",
                      disable_numparse=True)] if rows else []
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append(f"{len(rows)} job(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for r in recs:
        if r.status != "FINISHED":
            lines.append(f"  {r.status} {r.label}: {(r.error or 'no error recorded').splitlines()[-1].strip(' -')}")
    table = {c: [r[c] for r in rows] for c in COLUMNS}
    for prof, f in cost_models(recs).items():
        lines += ["", f"[nccl={prof}] " + describe(f)]
    return "\n".join(lines), table


def cost_models(recs: list[JobRecord]) -> dict:
    """A cost-model fit per NCCL profile with at least two measured step counts."""
    out = {}
    for prof in sorted({r.choice("nccl") for r in recs if r.speculative}):
        pts = points_from_records(recs, nccl=prof)
        if len(pts) >= 2:
            out[prof] = fit(pts, max_steps=max(8, max(p.steps for p in pts)))
    return out


def write_plots(recs: list[JobRecord], out_dir: Path) -> list[Path]:
    """throughput_vs_steps.png, phases.png, accept_len_vs_steps.png (those that have data)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_save(fig, out_dir / name) for name, fig in figures(recs).items()]


def figures(recs: list[JobRecord]) -> dict:
    """The report's matplotlib figures by file name (those that have data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    done = [r for r in recs if r.status == "FINISHED" and r.metrics]
    spec = [r for r in done if r.speculative and "throughput_tok_s" in r.metrics]
    base = [r for r in done if not r.speculative and "throughput_tok_s" in r.metrics]
    out: dict = {}
    if spec:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        profiles = sorted({r.choice("nccl") for r in spec})
        for prof in profiles:
            pts = sorted(((r.steps, r.metrics) for r in spec if r.choice("nccl") == prof), key=lambda p: p[0])
            xs = [p[0] for p in pts]
            ys = [p[1]["throughput_tok_s"] for p in pts]
            err = [[y - p[1].get("throughput_tok_s_ci95_lo", y) for y, p in zip(ys, pts)],
                   [p[1].get("throughput_tok_s_ci95_hi", y) - y for y, p in zip(ys, pts)]]
            line = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, label=f"EAGLE-3, nccl={prof}")
            for b in base:
                if b.choice("nccl") == prof:
                    ax.axhline(b.metrics["throughput_tok_s"], ls="--", color=line[0].get_color(),
                               label=f"baseline, nccl={prof}")
                    break
        for prof, f in cost_models(spec).items():
            ks = [r["steps"] for r in f.predictions]
            ax.plot(ks, [r["predicted_tok_s"] for r in f.predictions], ls=":", marker="x",
                    label=f"cost model, nccl={prof} (best: {f.best_steps} steps)")
        ax.set_xlabel("speculative steps (draft tokens per cycle)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("throughput (tok/s), mean with 95% CI")
        ax.set_title(f"Throughput vs steps ({spec[0].engine.name} engine, {spec[0].choice('hardware')})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        out["throughput_vs_steps.png"] = fig

        fig, ax = plt.subplots(figsize=(7, 4.5))
        pts = sorted(((r.steps, r.choice("nccl")), r.metrics["accept_len"]) for r in spec if "accept_len" in r.metrics)
        styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
        for i, prof in enumerate(sorted({p[0][1] for p in pts})):
            sel = [(k[0], v) for k, v in pts if k[1] == prof]
            marker, ls = styles[i % len(styles)]
            ax.plot([s for s, _ in sel], [v for _, v in sel], marker=marker, ls=ls, label=f"nccl={prof}")
        if pts:
            top = max(p[0][0] for p in pts)
            ax.plot([1, top], [2, top + 1], ls=":", color="grey", label="ideal (all drafts accepted)")
        ax.set_xlabel("speculative steps")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("accept length (tokens per verify, incl. bonus)")
        ax.set_title("Acceptance vs steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        out["accept_len_vs_steps.png"] = fig

        prof = [r for r in spec if "cycle_ms" in r.metrics]
        if prof:
            fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(prof)), 4.5))
            labels = [_short(r.label) for r in prof]
            bottom = [0.0] * len(prof)
            for phase, label in (("draft", "draft"), ("verify", "target verify"),
                                 ("extend", "draft re-extend"), ("other", "other")):
                vals = [r.metrics[f"{phase}_ms"] for r in prof]
                ax.bar(range(len(prof)), vals, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_xticks(range(len(prof)), labels, rotation=30, ha="right", fontsize=7)
            ax.set_ylabel("ms per speculative cycle")
            ax.set_title("Where each cycle's time goes")
            ax.legend(fontsize=8)
            out["phases.png"] = fig
    return out


def _short(label: str, n: int = 32) -> str:
    """Axis labels: the job's distinguishing overrides, cut to fit."""
    parts = [p for p in label.split(",") if not p.startswith(("tracking.", "hydra.", "benchmark.max_new",
                                                              "benchmark.runs", "benchmark.warmup"))]
    text = ",".join(parts) or label
    return text if len(text) <= n else text[: n - 1] + "~"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def from_mlflow(run_id: str, uri: str, dest: Path) -> Path:
    """Download the results.json of a sweep's child runs (parent run ``run_id``) under ``dest``."""
    from mlflow.tracking import MlflowClient

    from .tracking import resolve_uri

    client = MlflowClient(tracking_uri=resolve_uri(uri, Path.cwd()))
    parent = client.get_run(run_id)
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    for k in kids:
        client.download_artifacts(k.info.run_id, "results.json", str(dest / k.info.run_id))
    return dest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m spec_decode.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, help="a sweep dir or experiment dir")
    ap.add_argument("--plots", type=Path, default=None, help="where to write PNGs (default: PATH)")
    ap.add_argument("--mlflow-run", default=None, help="a sweep's parent run id (downloads its children)")
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    args = ap.parse_args(argv)
    if args.mlflow_run:
        import tempfile

        root = from_mlflow(args.mlflow_run, args.uri, Path(tempfile.mkdtemp(prefix="report_")))
    elif args.path is not None:
        if not args.path.is_dir():
            ap.error(f"{args.path}: not a directory")
        root = args.path
    else:
        ap.error("give a sweep/experiment dir or --mlflow-run ID")
    recs = collect(root)
    if not recs:
        ap.error(f"no results.json under {root}")
    text, _ = sweep_summary(recs)
    print(text)
    for p in write_plots(recs, args.plots or (args.path or Path("."))):
        print(f"plot: {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
