"""Reported experiments (experiments/<name>/): the DVC `report` stage, `compare` and the headline. The
sweep itself (the `bench` stage, `rebuild`) is run by ``spec_decode.bench``: a view only reads records.

    python -m spec_decode.views.experiment report embedded_steps_nccl   # metrics.json -> table, facts, plots, summary.json
    python -m spec_decode.views.experiment compare embedded_steps_nccl  # rebuilt (workspace) vs committed (HEAD)
    python -m spec_decode.views.experiment compare SWEEP_A SWEEP_B      # dirs, metrics.json or MLflow parent ids
    python -m spec_decode.views.experiment headline embedded_steps_nccl # metrics.json -> README's headline table
    python -m spec_decode.views.experiment starts SWEEP_1 SWEEP_2 SWEEP_3 # one design on several machine starts
    python -m spec_decode.views.experiment starts real_shape_h100x1 SWEEP --record  # compare then uses its starts

metrics.json holds one entry per job, keyed by the job's full override set (its Hydra override_dirname;
``baseline,<overrides>`` for a baseline): status, error, the config axes, the throughput summary
(mean, std, n, 95% CI), accept length, speedup with CI, phase times and shares, failed checks. It is the
report stage's only input: the table, the generated facts in the README and the plots are rebuilt from
the committed file (``records_from_metrics``). compare gives a verdict per cell (speedup intervals
overlap, accept length equal; spec_decode.analysis.compare) and exits 1 when a cell differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from pathlib import Path

from hydra import compose, initialize_config_dir
from tabulate import tabulate

from spec_decode.analysis import concurrency
from spec_decode.analysis.costmodel import nonneg_line
from spec_decode.core.config import register_configs
from spec_decode.views import compare as compare_view
from spec_decode.views import metrics_json
from spec_decode.views import starts as starts_view
from spec_decode.views.metrics_json import records_from_metrics
from spec_decode.views.plots import write_plots
from spec_decode.views.report import sweep_summary
from spec_decode.views.summary import summary

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- table:begin (python -m spec_decode.views.experiment report) -->", "<!-- table:end -->"
FACTS_BEGIN, FACTS_END = "<!-- facts:begin (python -m spec_decode.views.experiment report) -->", "<!-- facts:end -->"


def exp_dir(name: str, root: Path) -> Path:
    return root / "experiments" / name


def facts(metrics: dict) -> list[str]:
    """The numbers an experiment's conclusion cites, generated from its metrics.json (so prose never
    drifts from the table): speedups with CIs per profile, the best measured step count, acceptance
    by step count, phase costs per step and per verified token, baselines, checks."""
    metrics = {**metrics, "jobs": metrics.get("cells") or metrics["jobs"]}  # the block design: its cells
    recs = [r for r in records_from_metrics(metrics) if r.status == "FINISHED" and "throughput_tok_s" in r.metrics]
    spec = [r for r in recs if r.speculative and r.steps is not None]
    lines = []
    # one group per NCCL profile, and per concurrency / forced accept length where the sweep has that axis
    # (a step-count line across them would mix batch sizes / acceptances)
    by_load = concurrency.swept(recs)
    by_forced = len({r.forced_accept_len for r in spec}) > 1

    def group(r) -> tuple:
        conc = concurrency.concurrency_of(r) if by_load else None
        return r.choice("nccl"), conc, r.forced_accept_len if by_forced else None

    def order(g: tuple) -> tuple:  # None (an axis not swept) sorts first, numbers as numbers
        return tuple((x is not None, x if x is not None else 0) for x in g)

    for prof, conc, forced in sorted({group(r) for r in spec}, key=order):
        mine = sorted((r for r in spec if group(r) == (prof, conc, forced)), key=lambda r: r.steps)
        label = (
            f"`nccl={prof}`"
            + (f" at concurrency {conc}" if by_load else "")
            + (f" at forced accept length {forced}" if by_forced else "")
        )
        with_ci = [r for r in mine if "speedup_vs_baseline_ci95_lo" in r.metrics]
        if with_ci:
            lines.append(
                f"- {label} speedup vs its baseline (95% CI): "
                + ", ".join(
                    f"{r.metrics['speedup_vs_baseline']:.2f}x [{r.metrics['speedup_vs_baseline_ci95_lo']:.2f}, "
                    f"{r.metrics['speedup_vs_baseline_ci95_hi']:.2f}] at {r.steps}"
                    for r in with_ci
                )
                + " steps"
            )
        rerun = [r for r in with_ci if "speedup_vs_baseline_rerun95_lo" in r.metrics]
        if rerun:  # the block design's prediction interval for a rebuild (analysis.blocks)
            lines.append(
                f"- {label} rerun interval (95%: where an equal-size rebuild's speedup lands at this sweep's "
                "launch-to-launch noise): "
                + ", ".join(
                    f"[{r.metrics['speedup_vs_baseline_rerun95_lo']:.2f}, "
                    f"{r.metrics['speedup_vs_baseline_rerun95_hi']:.2f}] at {r.steps}"
                    for r in rerun
                )
                + " steps"
            )
        best = max(mine, key=lambda r: r.metrics["throughput_tok_s"])
        lines.append(
            f"- {label} best measured: {best.steps} steps at {best.metrics['throughput_tok_s']:.1f} "
            f"tok/s [{best.metrics['throughput_tok_s_ci95_lo']:.1f}, {best.metrics['throughput_tok_s_ci95_hi']:.1f}]"
        )
        phased = [r for r in mine if "verify_ms" in r.metrics]
        if len({r.steps for r in phased}) >= 2:  # costs >= 0 (costmodel.nonneg_line), with the fit quality
            va, vb, vq = nonneg_line([r.steps + 1 for r in phased], [r.metrics["verify_ms"] for r in phased])
            da, db, dq = nonneg_line([r.steps for r in phased], [r.metrics["draft_ms"] for r in phased])
            r2 = " / ".join("-" if q["r2"] is None else f"{q['r2']:.2f}" for q in (vq, dq))
            lines.append(
                f"- {label} verify = {va:.2f} + {vb:.3f} ms per verified token; "
                f"draft = {da:.2f} + {db:.3f} ms per step (least squares with costs >= 0 over "
                f"{len(phased)} jobs; R^2 {r2})"
            )
    paid = [r for r in spec if "speedup_vs_baseline_ci95_lo" in r.metrics]
    if paid:
        above = [r for r in paid if r.metrics["speedup_vs_baseline_ci95_lo"] > 1.0]
        lines.append(f"- {len(above)} of {len(paid)} spec jobs have a speedup whose 95% CI lies above 1.0")
    for forced in sorted({r.forced_accept_len for r in spec} if by_forced else {None}):
        by_steps: dict[int, list[float]] = {}
        for r in spec:
            if "accept_len" in r.metrics and (not by_forced or r.forced_accept_len == forced):
                by_steps.setdefault(r.steps, []).append(r.metrics["accept_len"])
        if by_steps:
            ks = sorted(by_steps)
            lines.append(
                "- accept length "
                + " / ".join(f"{statistics.fmean(by_steps[k]):.2f}" for k in ks)
                + " at "
                + " / ".join(str(k) for k in ks)
                + " steps"
                + (f" (forced to {forced})" if by_forced else "")
            )
    base = [r for r in recs if not r.speculative]
    if base:
        vals = [r.metrics["throughput_tok_s"] for r in base]
        spread = f" (max/min {max(vals) / min(vals):.3f})" if len(vals) > 1 else ""
        lines.append(
            "- baselines: " + ", ".join(f"`{r.label}` {r.metrics['throughput_tok_s']:.1f} tok/s" for r in base) + spread
        )
    everything = records_from_metrics(metrics)
    checked = [r for r in everything if r.status == "FINISHED" and r.checks]
    ok = [r for r in checked if not r.failed_checks]
    failed = sorted({c for r in checked for c in r.failed_checks})
    done = len([r for r in everything if r.status == "FINISHED"])
    lines.append(
        f"- {len(everything)} jobs, {done} finished; "
        + (
            f"{len(ok)} of the {len(checked)} checked pass every consistency check"
            + (f" (failed: {', '.join(failed)})" if failed else "")
            if checked
            else "no consistency checks in this metrics.json (written before it kept them)"
        )
    )
    return lines


def report(name: str, root: Path) -> None:
    """Table, facts, plots and summary.json (DVC's metric: the table's headline numbers) from the committed
    metrics.json (the bench stage's output)."""
    d = exp_dir(name, root)
    metrics = reported_metrics(name, root)
    readme = d / "README.md"
    body = readme.read_text() if readme.exists() else None
    if body is not None and (lost := [m for m in (BEGIN, END, FACTS_BEGIN, FACTS_END) if m not in body]):
        raise SystemExit(
            f"report {name}: {readme} lacks {', '.join(lost)}: add the markers where the table and facts go"
        )
    record = starts_view.facts(d, metrics, root)  # read (and checked) first: a broken record writes nothing
    recs = records_from_metrics(metrics)
    text, _ = sweep_summary(recs)
    write_plots(recs, d)
    (d / "table.txt").write_text(text + "\n")
    (d / "summary.json").write_text(json.dumps(summary(recs), indent=2, sort_keys=True) + "\n")
    if body is not None:
        body = _replace_block(body, BEGIN, END, f"```\n{text}\n```")
        body = _replace_block(body, FACTS_BEGIN, FACTS_END, "\n".join(facts(metrics) + record))
        readme.write_text(body)
    print(text)


HEADLINE_BEGIN = "<!-- headline:begin (python -m spec_decode.views.experiment headline {name}) -->"
HEADLINE_END = "<!-- headline:end -->"


def protocol(name: str, root: Path, metrics: dict | None = None) -> str:
    """What each job ran: runs and blocks as the record holds them (``metrics``: each job's run count, its
    block labels), tokens, warmup and sampling as the experiment's config composes them (the record keeps
    no token count)."""
    register_configs()
    with initialize_config_dir(config_dir=str((root / "conf").resolve()), version_base="1.3"):
        b = compose("config", overrides=[f"experiment={name}"]).benchmark
    jobs = (metrics or {}).get("jobs") or {}
    counts = [e["throughput_tok_s_n"] for e in jobs.values() if isinstance(e.get("throughput_tok_s_n"), int)]
    runs = statistics.mode(counts) if counts else b.runs
    labels = {(e.get("axes") or {}).get("benchmark.block", 0) for e in jobs.values()}  # block 0: the default
    n_blocks = len(labels) if jobs else int(b.blocks)
    greedy = "greedy " if float(b.temperature) == 0.0 else ""
    blocks = f", {n_blocks} blocks" if n_blocks > 1 else ""
    warmup = f"{b.warmup} warmup" + ("s" if int(b.warmup) != 1 else "")
    return f"{runs} runs x {b.max_new_tokens} {greedy}tokens per job, {warmup}{blocks}"


def headline(metrics: dict, name: str, proto: str) -> str:
    """The README's headline table, from a reported experiment's metrics.json: every job, baselines
    first, then by NCCL profile and step count; the speedup with its CI and how it was taken. ``proto``:
    what each job ran (``protocol``)."""
    metrics = {**metrics, "jobs": metrics.get("cells") or metrics["jobs"]}  # the block design: one row per cell
    recs = [r for r in records_from_metrics(metrics) if r.status == "FINISHED" and "throughput_tok_s" in r.metrics]
    recs.sort(key=lambda r: (r.speculative, r.choice("nccl") or "", r.steps or 0))
    entries = metrics["jobs"]
    rows = []
    for r in recs:
        m, e = r.metrics, entries[r.name]
        ci = f"[{m['throughput_tok_s_ci95_lo']:.0f}, {m['throughput_tok_s_ci95_hi']:.0f}]"
        speedup = "-"
        if "speedup_vs_baseline" in m:
            speedup = (
                f"{m['speedup_vs_baseline']:.2f}x [{m['speedup_vs_baseline_ci95_lo']:.2f}, "
                f"{m['speedup_vs_baseline_ci95_hi']:.2f}] ({e.get('speedup_method', 'welch')})"
            )
        rows.append(
            [
                ("baseline" if not r.speculative else f"steps={r.steps}"),
                r.choice("nccl"),
                f"{m['throughput_tok_s']:.0f} {ci}",
                speedup,
                f"{m['accept_len']:.2f}" if "accept_len" in m else "-",
                f"{m['accept_rate_draft']:.2f}" if "accept_rate_draft" in m else "-",
                f"{m['cycle_ms']:.2f}" if "cycle_ms" in m else "-",
                " / ".join(f"{m[k]:.2f}" for k in ("draft_ms", "verify_ms", "extend_ms")) if "cycle_ms" in m else "-",
                "ok" if not r.failed_checks else "FAILED: " + ", ".join(r.failed_checks),
            ]
        )
    table = tabulate(
        rows,
        headers=[
            "job",
            "nccl",
            "tok/s [95% CI]",
            "speedup [95% CI] (method)",
            "accept len",
            "draft accept rate",
            "cycle ms",
            "draft / verify / re-extend ms",
            "checks",
        ],
        tablefmt="github",
        disable_numparse=True,
    )
    commit = (metrics.get("git_commit") or "?")[:10] + (" (dirty tree)" if metrics.get("git_dirty") else "")
    return (
        f"`python run.py -m experiment={name}` ({proto}; {machine(metrics.get('host') or {})}; "
        f"[experiments/{name}/](experiments/{name}/); code {commit}; generated from its metrics.json by "
        f"`python -m spec_decode.views.experiment headline {name}`):\n\n{table}"
    )


def machine(host: dict) -> str:
    """Where a sweep ran, as its metrics.json's host facts say (the numbers depend on it)."""
    if not host:
        return "machine not recorded"
    names = [g.get("name", "?") if isinstance(g, dict) else str(g) for g in host.get("gpus") or []]
    gpus = ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))
    cpu = f"{host.get('cpu_model') or '?'}, {host.get('usable_cores') or host.get('logical_cores') or '?'} cores"
    return f"measured on {cpu}" + (f", {gpus}" if gpus else "")


def write_headline(name: str, root: Path, readme: Path) -> str:
    """Replace the headline block of ``readme`` (between its markers); a README without this experiment's
    markers is refused, never appended to."""
    begin = HEADLINE_BEGIN.format(name=name)
    if not readme.is_file() or begin not in (body := readme.read_text()) or HEADLINE_END not in body:
        raise SystemExit(
            f"headline {name}: {readme} has no headline block for {name} (the lines {begin} ... {HEADLINE_END}); "
            "add both markers where the table belongs, then run this again"
        )
    metrics = reported_metrics(name, root)
    text = headline(metrics, name, protocol(name, root, metrics))
    readme.write_text(_replace_block(body, begin, HEADLINE_END, text))
    return text


def reported_metrics(name: str, root: Path) -> dict:
    """experiments/NAME/metrics.json, refused (with what to run instead) when it holds no measured jobs:
    a drafter experiment (its own report) or a source's claim not run here."""
    path = exp_dir(name, root) / "metrics.json"
    if not path.exists():
        raise SystemExit(f"{name}: {path} not found: nothing measured yet; {compare_view.bench_hint(name, root)}")
    try:
        metrics = metrics_json.read(path)
    except ValueError as e:
        raise SystemExit(f"{name}: {str(e).replace('report NAME', f'report {name}')}") from None
    if claim := metrics_json.claim(metrics):
        raise SystemExit(f"{name}: {path} {claim}; nothing measured to report")
    return metrics


def _replace_block(body: str, begin: str, end: str, content: str) -> str:
    """``body`` with what lies between ``begin`` and ``end`` replaced (the callers refuse a body without them)."""
    block = f"{begin}\n{content}\n{end}"
    return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, body, flags=re.S)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.views.experiment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="render the table (into README.md) and plots")
    r.add_argument("name")
    h = sub.add_parser("headline", help="metrics.json -> the headline table in README.md (between its markers)")
    h.add_argument("name")
    h.add_argument("--readme", type=Path, default=None, help="default: README.md of the project")
    compare_view.add_parser(sub)
    s = sub.add_parser(
        "starts",
        help="one design's sweeps from several machine starts: the shift a start adds, and where the next lands",
        description="starts A B [C ...]: sweeps of one design (metrics.json, experiment or multirun dirs, MLflow "
        "parent run ids), each from its own machine start, first the reference; an experiment NAME first brings "
        "the starts it records. Per spec cell: each start's speedup, the sd between starts and within (launch to "
        "launch), a one-way ANOVA on the block values (a start effect beyond launch noise?) and, from 3 starts, "
        "the 95% interval where the next start's cell lands (docs/reproducibility.md).",
    )
    s.add_argument("sources", nargs="+", metavar="NAME | SWEEP")
    s.add_argument("--uri", default=None, help="MLflow store for run ids (default: MLFLOW_TRACKING_URI)")
    s.add_argument(
        "--record",
        action="store_true",
        help="starts NAME SWEEP ...: add the sweeps (metrics.json "
        "files in the repository) to experiments/NAME/starts.json; compare NAME judges by its starts",
    )
    args = ap.parse_args(argv)
    root = Path(os.environ.get("DVC_ROOT") or Path.cwd())
    if args.cmd == "starts":
        try:
            with compare_view.input_errors(ap):  # an unreadable sweep: exit 2, as compare's
                sweeps, names = starts_view.gather(
                    args.sources, args.record, root, lambda src: compare_view.load_sweep(src, args.uri, root)
                )
        except ValueError as e:
            ap.error(str(e))
        print("\n".join(starts_view.table(sweeps, names, root)))
        return
    if args.cmd == "compare":
        compare_view.main(args, ap, root)
    if not (root / "conf" / "experiment" / f"{args.name}.yaml").exists():
        ap.error(f"no experiment {args.name!r}: conf/experiment/{args.name}.yaml not found")
    if args.cmd == "report":
        report(args.name, root)
    else:
        print(write_headline(args.name, root, args.readme or root / "README.md"))


if __name__ == "__main__":
    main()
