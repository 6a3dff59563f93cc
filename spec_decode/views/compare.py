"""`python -m spec_decode.views.experiment compare`: two sweeps cell by cell, with a verdict (the numbers:
``analysis.compare``; an experiment's recorded starts: ``views.starts``).

    compare NAME            the rebuilt metrics.json (workspace, or experiments/NAME/rebuild/) vs the committed one
    compare NAME SWEEP      a sweep of NAME's design vs NAME's metrics.json (the workspace's), judged by its recorded starts
    compare A B             any two sweeps: metrics.json files, experiment or multirun dirs, MLflow parent run ids

NAME may be given as experiments/NAME too. Exit 1 when a cell differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from tabulate import tabulate

from spec_decode.analysis import compare as cmp
from spec_decode.views import starts as starts_view
from spec_decode.views.metrics_json import claim, to_metrics
from spec_decode.views.report import records_of

REBUILD = "rebuild"  # experiments/<name>/rebuild/: ignored by git (.gitignore), so a rerun never dirties git


def compare(
    a: dict, b: dict, names: tuple[str, str] = ("A", "B"), starts: starts_view.Judged = starts_view.Judged({}, [])
) -> tuple[list[str], bool]:
    """Per cell: the speedup intervals overlap or not, accept length equal or not; the hosts' differences
    and loads; the verdict (spec_decode.analysis.compare). ``starts``: A's next-start intervals and their
    notes (``views.starts.for_compare``). Returns (lines, differ)."""
    rows = cmp.compare(a, b, starts.intervals)
    table = tabulate(
        [[r.cell, r.a, r.b, r.accept, r.verdict] for r in rows],
        headers=["cell", f"{names[0]}: speedup (tok/s for baselines) [95% CI]", f"{names[1]}", "accept len", "verdict"],
        tablefmt="plain",
        disable_numparse=True,
    ).splitlines()
    notes = [n.replace("A: ", f"{names[0]}: ", 1).replace("B: ", f"{names[1]}: ", 1) for n in cmp.host_notes(a, b)]
    verdict = cmp.verdict(rows)
    cover = cmp.coverage(rows)
    cover = [cover.replace(" of B ", f" of {names[1]} ").replace(" A's ", f" {names[0]}'s ")] if cover else []
    cover += [n.replace(" B ", f" {names[1]} ", 1) for n in starts.notes]
    cover += starts_view.hints(rows, starts)
    return [*table, "", *notes, *cover, f"verdict: {verdict}"], verdict.startswith("DIFFER")


@contextlib.contextmanager
def input_errors(ap: argparse.ArgumentParser):
    """A source or record that cannot be read (``SystemExit`` with its message) becomes ``ap.error``: exit
    2, an input error, never read as compare's exit 1 (a cell differs)."""
    try:
        yield
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        ap.error(e.code)


def load_sweep(src: str, uri: str | None, root: Path | None = None) -> dict:
    """A sweep as metrics.json: a metrics.json file, an experiment dir holding one, or the records of a
    multirun dir / an MLflow parent run (``report.records_of``); a reported experiment's NAME."""
    root = root or Path(os.environ.get("DVC_ROOT") or ".")
    path = Path(src)
    path = path if path.exists() else starts_view.experiment_dir(src, root) or path
    if not path.exists() and ("/" in src or src.endswith(".json")):  # a path, not an MLflow run id
        raise SystemExit(f"sweep: {src}: no such file or directory (from {Path.cwd()})")
    if path.is_dir() and (path / "metrics.json").is_file() and not any(path.glob("*/results.json")):
        path = path / "metrics.json"
    return starts_view.read_metrics(path, "sweep") if path.is_file() else to_metrics(records_of(src, uri))


def same_metrics_warning(rebuilt: dict, reported: dict, name: str, rev: str) -> str | None:
    """compare on a fresh clone reads the committed metrics.json twice (a plain ``dvc repro`` skips an
    up-to-date stage): every verdict would be "within noise" by construction. Say so."""
    if rebuilt != reported:
        return None
    return (
        f"warning: experiments/{name}/metrics.json in the workspace is the one committed at {rev}: "
        f"nothing was rebuilt, so this compares the committed numbers with themselves. Rerun the "
        f"experiment first: python -m spec_decode.bench rebuild {name} (it compares itself)"
    )


def bench_hint(name: str, root: Path) -> str:
    """How to produce experiments/NAME/metrics.json: its DVC stage (``bench@NAME``, or the frozen GPU stage
    whose output it is, with the unfreeze), else the bench command (an experiment no stage holds yet)."""
    out = f"experiments/{name}/metrics.json"
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        stages = {}
    for stage, spec in stages.items():
        if (
            isinstance(spec.get("foreach"), list)
            and name in spec["foreach"]
            and "${item}/metrics.json" in str((spec.get("do") or {}).get("outs"))
        ):
            return f"`dvc repro {stage}@{name}`"
        if out in str(spec.get("outs")) or out in str(spec.get("metrics")):
            return f"`dvc unfreeze {stage} && dvc repro -f {stage}`" if spec.get("frozen") else f"`dvc repro {stage}`"
    return f"no DVC stage writes {out}: `python -m spec_decode.bench experiment {name}`"


def committed_metrics(path: Path, rev: str, root: Path) -> dict:
    rel = path.resolve().relative_to(root.resolve())
    out = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"compare: {rel} is not in git at {rev}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def add_parser(sub) -> None:
    c = sub.add_parser(
        "compare",
        help="two sweeps cell by cell with a verdict (exit 1 when a cell differs)",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("sources", nargs="+", metavar="SOURCE", help="NAME, NAME SWEEP, or A B (above)")
    c.add_argument("--rev", default=None, help="git revision holding the reported metrics (compare NAME; default HEAD)")
    c.add_argument("--uri", default=None, help="MLflow store for run ids (default: MLFLOW_TRACKING_URI)")


def main(args: argparse.Namespace, ap: argparse.ArgumentParser, root: Path) -> None:
    """The ``compare`` subcommand: prints the comparison, exits 1 when a cell differs."""
    if len(args.sources) > 2:
        ap.error("compare takes an experiment name (NAME or experiments/NAME), NAME and a sweep, or two sweeps")
    if len(args.sources) == 2 and args.rev is not None:
        ap.error(
            "compare --rev applies to compare NAME alone; for another revision's numbers beside a sweep: "
            "git show REV:experiments/NAME/metrics.json > /tmp/a.json, then compare /tmp/a.json SWEEP"
        )
    with input_errors(ap):
        if len(args.sources) == 2:
            a, b = (load_sweep(src, args.uri, root) for src in args.sources)
            names = tuple(args.sources)
        else:
            a, b, names = compare_experiment(ap, args.sources[0], args.rev or "HEAD", root)
        judged = starts_view.for_compare(args.sources[0], a, b, root)
    lines, differ = compare(a, b, names, judged)
    print("\n".join(lines))
    raise SystemExit(1 if differ else 0)


def compare_experiment(ap: argparse.ArgumentParser, src: str, rev: str, root: Path) -> tuple[dict, dict, tuple]:
    """(reported at ``rev``, rebuilt in the workspace, their names) of a named experiment."""
    name = Path(src).name if Path(src).parent.name == "experiments" else src
    if not (root / "conf" / "experiment" / f"{name}.yaml").exists():
        ap.error(
            f"no experiment {name!r}: conf/experiment/{name}.yaml not found under {root} (run from the repository "
            "root or set DVC_ROOT; or give two sweeps)"
        )
    path = root / "experiments" / name / "metrics.json"
    if not path.exists():
        ap.error(f"{path} not found: nothing measured yet; {bench_hint(name, root)} first")
    rebuilt, reported = json.loads(path.read_text()), committed_metrics(path, rev, root)
    if rebuilt == reported and (path.parent / REBUILD / "metrics.json").exists():  # `rebuild` left its numbers
        rebuilt = json.loads((path.parent / REBUILD / "metrics.json").read_text())
    if what := claim(rebuilt):  # nothing measured on the rebuilt side: no verdict to give
        ap.error(f"{path} {what}, and nothing was rebuilt: measure it first ({bench_hint(name, root)})")
    if (w := same_metrics_warning(rebuilt, reported, name, rev)) is not None:
        print(w, file=sys.stderr)
    return reported, rebuilt, (f"reported ({rev})", "rebuilt")


if __name__ == "__main__":  # the library behind a subcommand
    from spec_decode.core.errors import run_as

    run_as(__spec__.name, "spec-decode compare", "spec_decode.views.experiment compare")
