"""Reports: a table per sweep and PNG plots, rendered from job records (results.json files, or a
reported experiment's committed metrics.json via ``metrics_json.records_from_metrics``). Reads only.

    python -m spec_decode.views.report multirun/2026-11-29/10-00-00_adhoc     # a sweep dir
    python -m spec_decode.views.report experiments/embedded_steps_nccl          # an experiment dir
    python -m spec_decode.views.report --mlflow-run <parent run id>             # a sweep logged to MLflow

Tables: one row per job (lossless verdict where the job checked it; performance-only jobs -- forced
acceptance -- labelled), then where the records carry them: acceptance per draft position with the
histogram of accepted drafts per verify and the per-request accept length (weighted by verifies and
unweighted); latency percentiles (TTFT / ITL / TPOT / E2E, P50 / P90 / P99); acceptance and tok/s per
prompt category; the cost model per NCCL profile; the step recommendation with every cell's verdict.

Plots: throughput vs steps per NCCL profile (95% CI bars, baseline lines, the cost model's curve in
the series' colour up to one step beyond the measured ones); speedup vs steps with CI bars (paired or
Welch, as measured); stacked phase bars per job, labelled by steps and profile; accept length vs steps;
accepted drafts per verify (histogram, share of verifies, per job); acceptance rate by draft position
(measured, per job, with the cost model's fitted decay). Legends sit right of the axes. They go beside
the records (the sweep dir, or the download dir of --mlflow-run); from a metrics.json only with --plots:
an experiment's committed plots are its report stage's (python -m spec_decode.views.experiment report NAME).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

from spec_decode.analysis import batchcost, blocks, concurrency, control, effects, host, recommend
from spec_decode.analysis.costmodel import describe
from spec_decode.analysis.host import describe as describe_host
from spec_decode.core import store
from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record.results import JobRecord, collect, performance_only, section
from spec_decode.views import metrics_json
from spec_decode.views.metrics_json import claim, records_from_metrics
from spec_decode.views.plots import cost_models, write_plots

ACCEPTS = (
    "give a sweep dir (multirun/DATE/TIME_NAME) or a job dir (their results.json), an experiment dir "
    "(experiments/NAME, its metrics.json) or a metrics.json file, or --mlflow-run ID"
)

COLUMNS = (
    "job",
    "status",
    "tok/s",
    "95% CI",
    "CV%",
    "speedup",
    "speedup 95% CI",
    "accept len",
    "cycle ms",
    "draft%",
    "verify%",
    "extend%",
    "other%",
    "checks",
)


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


LATENCY = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))


def job_label(rec: JobRecord) -> str:
    return rec.label + (" [performance-only]" if rec.speculative and performance_only(rec) else "")


def lossless_cell(rec: JobRecord) -> str:
    ll = rec.lossless
    if ll is None:
        return "-"
    if ll.match_rate is not None and ll.verdict != "skipped":
        return f"{ll.verdict} ({100 * ll.match_rate:.0f}% match)"
    return ll.verdict


def row(rec: JobRecord) -> dict:
    m = rec.metrics
    failed = rec.failed_checks
    return {
        "job": job_label(rec),
        "status": rec.status,
        "tok/s": _fmt(m.get("throughput_tok_s")),
        "95% CI": (
            f"[{m['throughput_tok_s_ci95_lo']:.1f}, {m['throughput_tok_s_ci95_hi']:.1f}]"
            if "throughput_tok_s_ci95_lo" in m
            else "-"
        ),
        "CV%": _fmt(100 * m["throughput_tok_s_cv"] if "throughput_tok_s_cv" in m else None),
        "speedup": _fmt(m.get("speedup_vs_baseline"), ".3f"),
        "speedup 95% CI": (
            f"[{m['speedup_vs_baseline_ci95_lo']:.3f}, {m['speedup_vs_baseline_ci95_hi']:.3f}]"
            if "speedup_vs_baseline_ci95_lo" in m
            else "-"
        ),
        "accept len": _fmt(m.get("accept_len"), ".2f"),
        "cycle ms": _fmt(m.get("cycle_ms"), ".2f"),
        "draft%": _fmt(m.get("draft_pct"), ".0f"),
        "verify%": _fmt(m.get("verify_pct"), ".0f"),
        "extend%": _fmt(m.get("extend_pct"), ".0f"),
        "other%": _fmt(m.get("other_pct"), ".0f"),
        "checks": "-" if not rec.checks else ("ok" if not failed else "FAILED: " + ",".join(failed)),
        "lossless": lossless_cell(rec),
    }


def acceptance_table(recs: list[JobRecord]) -> str | None:
    """Per job: the acceptance rate at each draft position, the histogram of accepted drafts per verify
    (its source), the accept length per request weighted by verifies and unweighted."""
    spec = [r for r in recs if r.speculative and r.acceptance and r.acceptance.histogram]
    if not spec:
        return None
    depth = max(len(r.acceptance.histogram) - 1 for r in spec)
    headers = [
        "job",
        *(f"pos{i}" for i in range(1, depth + 1)),
        "histogram (verifies by accepted drafts 0..k)",
        "source",
        "accept len (verify-weighted)",
        "accept len (request mean)",
    ]
    rows = []
    for r in spec:
        a = r.acceptance
        rates = list(a.per_position or [])
        rows.append(
            [
                job_label(r),
                *(_fmt(x, ".3f") for x in rates + [None] * (depth - len(rates))),
                " ".join(str(n) for n in a.histogram),
                a.source or "-",
                _fmt(a.accept_len_weighted, ".3f"),
                _fmt(a.accept_len_unweighted, ".3f"),
            ]
        )
    return "acceptance rate by draft position: P(accepted >= i | accepted >= i-1)\n" + tabulate(
        rows, headers=headers, tablefmt="simple", disable_numparse=True
    )


def latency_table(recs: list[JobRecord]) -> str | None:
    """TTFT / ITL / TPOT / E2E percentiles (ms) of each job that streamed its requests."""
    have = [r for r in recs if r.latency is not None]
    if not have:
        return None
    rows = []
    for r in have:
        cells = []
        for key, _ in LATENCY:
            p = getattr(r.latency, f"{key}_ms")
            cells.append(" / ".join(_fmt(x, ".2f") for x in (p.p50, p.p90, p.p99)) if p else "-")
        n = r.latency.itl_ms.n if r.latency.itl_ms else None
        rows.append([job_label(r), *cells, n if n is not None else "-"])
    headers = ["job", *(f"{name} ms p50 / p90 / p99" for _, name in LATENCY), "tokens (ITL n)"]
    return "token latency (streamed requests; a chunk of n tokens spreads its gap over its n tokens)\n" + tabulate(
        rows, headers=headers, tablefmt="simple", disable_numparse=True
    )


def category_table(recs: list[JobRecord]) -> str | None:
    """Accept length and tok/s per prompt category, per job."""
    rows = []
    for r in recs:
        for name, c in sorted((section(r, "categories") or {}).items()):
            rows.append([job_label(r), name, c.n, _fmt(c.accept_len, ".2f"), _fmt(c.throughput_tok_s)])
    if not rows:
        return None
    return "per prompt category\n" + tabulate(
        rows, headers=["job", "category", "requests", "accept len", "tok/s"], tablefmt="simple", disable_numparse=True
    )


def sweep_summary(recs: list[JobRecord]) -> tuple[str, dict[str, list]]:
    """A text table (console) and the same as columns (MLflow log_table). Jobs that did not finish
    are counted by status, each with its reason."""
    rows = [row(r) for r in recs]
    # the lossless column only where a job checked it (older records and sweeps without a baseline arm)
    columns = COLUMNS + (("lossless",) if any(r["lossless"] != "-" for r in rows) else ())
    lines = (
        [tabulate([[r[c] for c in columns] for r in rows], headers=columns, tablefmt="simple", disable_numparse=True)]
        if rows
        else []
    )
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append(f"{len(rows)} job(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for r in recs:
        if r.status != "FINISHED":
            lines.append(f"  {r.status} {r.label}: {(r.error or 'no error recorded').splitlines()[-1].strip(' -')}")
    warned: dict[str, int] = {}  # each distinct warning once (tp over the useful cores, drift ...)
    for r in recs:
        for w in r.warnings:
            warned[w] = warned.get(w, 0) + 1
    lines += [f"  warning ({n} job(s)): {w}" for w, n in warned.items()]
    table = {c: [r[c] for r in rows] for c in columns}
    for part in (acceptance_table(recs), latency_table(recs), category_table(recs)):
        if part:
            lines += ["", part]
    cells = blocks.cells(recs)  # the block design's cells (issue 25); the records themselves otherwise
    if cells is not recs:
        lines += [
            "",
            f"cells over blocks ({blocks.interval_label(recs)}):",
            tabulate(
                [[row(r)[c] for c in COLUMNS] for r in cells], headers=COLUMNS, tablefmt="simple", disable_numparse=True
            ),
        ]
    lines += ["", f"intervals: {blocks.interval_label(recs)}"]
    if plan := blocks.projection(cells):
        lines.append(plan)
    for prof, f in cost_models(cells).items():
        lines += ["", f"[nccl={prof}] " + describe(f)]
    if concurrency.swept(cells):  # issue 28: speedup against load, crossover, steps per concurrency
        lines += ["", *concurrency.describe(cells), batchcost.describe_batch(batchcost.batch_model(cells))]
    lines += ["", control.tag(control.check(cells))]
    if said := effects.describe(effects.effects(cells)):  # issue 44: per axis, whether it mattered
        lines += ["", *said]
    rec = recommend.recommend(cells)
    if rec is not None:
        lines += ["", recommend.describe(rec)]
    fps = {json.dumps(r.provenance.host, sort_keys=True) for r in recs if r.provenance.host}
    lines += [describe_host(json.loads(fp)) for fp in sorted(fps)]
    loads = [r.metrics["host_load1"] for r in recs if "host_load1" in r.metrics]
    if loads:
        lines.append(
            f"load (1 min) during the timed runs: median {statistics.median(loads):.1f}, max "
            f"{max(r.metrics.get('host_load1_max', 0) for r in recs):.1f}; CPU steal "
            f"{max(r.metrics.get('host_steal_pct', 0) for r in recs):.1f}% at most"
        )
    probed = [r for r in recs if "host_probe_us" in r.metrics]
    if probed:  # the runner's own speed at each end of the timed runs (runner.machine.probe_us): a figure,
        # not an alarm (on the lent H200 it flipped 1.0 <-> 2.0 ms between jobs of steady throughput)
        mid = statistics.median(r.metrics["host_probe_us"] for r in probed)
        lo = min(r.metrics["host_probe_us"] for r in probed)
        hi = max(r.metrics["host_probe_us_max"] for r in probed)
        lines.append(
            f"host probe (the runner's time for a fixed pure-Python task, larger = slower): median {mid:.0f} us, "
            f"{lo:.0f}-{hi:.0f} us over {len(probed)} job(s)"
        )
    lines += server_cpu_lines(recs)
    return "\n".join(lines), table


def server_cpu_lines(recs: list[JobRecord]) -> list[str]:
    """Per job, each server process's CPU over the timed runs (analysis.host.server_cpu), where recorded: which
    process works while the server serves (a figure: a rank polling its GPU reads 100% busy too)."""
    said = [
        (r.label, items, host.server_cpu_items(r.metrics, baseline=True))
        for r in recs
        if (items := host.server_cpu_items(r.metrics))
    ]
    if not said:
        return []
    out = ["server processes' CPU over the timed runs, % of one core (CPU ms per 1k tokens of that server's runs):"]
    for label, items, base in said:
        out.append(f"  {label}: {items}" + (f" | its baseline server: {base}" if base else ""))
    return out


def from_mlflow(run_id: str, uri: str) -> Path:
    """Download the results.json of a sweep's child runs (parent run ``run_id`` in the store ``uri``) into
    a new temp dir, returned. LookupError naming the run and the store when they cannot be read (no such
    run, a run without children); the dir is then removed."""
    with frozen_imports():  # lazy: mlflow costs seconds of start-up; only --mlflow reads a store
        from mlflow.tracking import MlflowClient

    dest = Path(tempfile.mkdtemp(prefix=f"spec_decode_report_{run_id[:8]}_"))
    done = False
    try:
        client = MlflowClient(tracking_uri=store.readable(uri))
        try:
            parent = client.get_run(run_id)
            kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
            for k in kids:
                client.download_artifacts(k.info.run_id, "results.json", str(dest / k.info.run_id))
        except Exception as e:  # noqa: BLE001 - whatever MLflow raises, the answer is the same
            raise LookupError(
                f"run {run_id!r} not read from the MLflow store {uri} ({type(e).__name__}: {e}); a sweep's "
                "parent run id of another store? name it with --uri or MLFLOW_TRACKING_URI"
            ) from e
        if not kids:
            raise LookupError(
                f"run {run_id!r} in the MLflow store {uri} has no child runs: give a sweep's parent run id "
                "(the sweep's last lines name it)"
            )
        done = True
        return dest
    finally:
        if not done:  # a failed or interrupted download leaves nothing behind
            shutil.rmtree(dest, ignore_errors=True)


def records_of(src: str, uri: str | None) -> list[JobRecord]:
    """The records of a multirun dir, or of an MLflow parent run id (its children's results.json, from
    ``uri`` or MLFLOW_TRACKING_URI); SystemExit naming the source when there are none."""
    if Path(src).is_dir():
        recs = collect(Path(src))
    else:
        try:
            uri = store.readable(store.store_uri(uri))
        except store.StoreMissing as e:
            raise SystemExit(f"{src!r} is not a directory, and {e}") from e
        try:
            dest = from_mlflow(src, uri)
            recs = collect(dest)  # read into memory: the download dir goes (compare and starts draw nothing)
            shutil.rmtree(dest, ignore_errors=True)
        except LookupError as e:
            raise SystemExit(f"{src!r} is neither a directory nor a sweep's parent run: {e}") from e
    if not recs:
        raise SystemExit(f"no results.json in {src}")
    return recs


def records_at(path: Path) -> tuple[list[JobRecord], Path | None]:
    """The records at ``path`` and where their plots go unless --plots says: the results.json under a sweep
    or job dir (plots beside them), else a metrics.json -- the file, or the one in an experiment dir (no
    plots: the dir keeps its own). ValueError naming the path and what it accepts when there are none."""
    path = path.parent if path.name == "results.json" and path.is_file() else path  # a job's record: its dir
    if path.is_dir() and (recs := collect(path)):
        return recs, path
    metrics = path / "metrics.json" if path.is_dir() else path
    if not metrics.is_file():
        found = "no results.json under it, no metrics.json in it" if path.is_dir() else "no such file or directory"
        raise ValueError(f"{path}: {found}; {ACCEPTS}")
    if what := claim(body := metrics_json.read(metrics)):
        raise ValueError(f"{metrics} {what}: nothing measured to report")
    return records_from_metrics(body), None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.views.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "path", nargs="?", type=Path, help="a sweep or job dir (results.json), an experiment dir or a metrics.json"
    )
    ap.add_argument(
        "--plots",
        type=Path,
        default=None,
        help="where to write PNGs (default: a sweep or job PATH, or the named download dir of --mlflow-run; "
        "from a metrics.json none unless given)",
    )
    ap.add_argument("--mlflow-run", default=None, help="a sweep's parent run id (downloads its children)")
    ap.add_argument(
        "--uri",
        default=None,
        help="the MLflow store of --mlflow-run (default: $MLFLOW_TRACKING_URI, "
        "else sqlite:///mlflow.db in the current directory)",
    )
    args = ap.parse_args(argv)
    plots: Path | None
    if args.mlflow_run:
        try:
            root = from_mlflow(args.mlflow_run, store.readable(store.store_uri(args.uri)))
        except (store.StoreMissing, LookupError) as e:
            ap.error(str(e))
        print(f"downloaded the sweep's results.json files to {root}", file=sys.stderr)
        recs, plots = collect(root), root
    elif args.path is not None:
        try:
            recs, plots = records_at(args.path)
        except ValueError as e:
            ap.error(str(e))
    else:
        ap.error(f"no records named; {ACCEPTS}")
    text, _ = sweep_summary(recs)
    print(text)
    # Plots go beside the records (the sweep dir, or the download dir of --mlflow-run): never the cwd.
    plots = args.plots or plots
    if plots is None:
        print(f"plots: none drawn (those beside {args.path} stay as they are); --plots DIR draws them", file=sys.stderr)
        return
    for p in write_plots(recs, plots):
        print(f"plot: {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
