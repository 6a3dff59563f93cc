"""`python -m spec_decode.views.experiment starts SWEEP_1 SWEEP_2 [SWEEP_3 ...]`: one design's sweeps from
several machine starts as a table (the numbers: ``analysis.starts``; docs/reproducibility.md, "Several
starts").

An experiment records its other starts in ``experiments/<name>/starts.json`` (``starts NAME SWEEP ... --record``;
its metrics.json is start 1): then ``starts NAME`` shows them all, and ``compare`` judges a rebuild of it by
each cell's next-start interval, which holds a start's shift, instead of one start's rerun interval.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from tabulate import tabulate

from spec_decode.analysis import compare as cmp
from spec_decode.analysis import starts as st
from spec_decode.views import metrics_json


def _pct(sd: float | None) -> str:
    return "-" if sd is None else f"{100 * sd:.2f}%"


def table(sweeps: list[dict], names: list[str], root: Path) -> list[str]:
    """Per spec cell: each start's speedup, the sd between starts and within (launch to launch), the start
    effect's test and where the next start's cell lands; then which sweep is which start, what makes them not
    one design (if anything), and the summary line."""
    rows = st.starts(sweeps, names)
    k = len(sweeps)
    body = [
        [r.cell, *("-" if v is None else f"{v:.3f}" for v in r.values), _pct(r.between_sd)]
        + [_pct(r.test.within_sd if r.test else None), r.effect]
        + ["-" if r.interval is None else f"[{r.interval[0]:.3f}, {r.interval[1]:.3f}]"]
        for r in rows
    ]
    headers = ["cell", *(f"start {i + 1}" for i in range(k)), "sd between starts", "sd within (launches)"]
    headers += [
        "start effect (one-way ANOVA)",
        "next start, 95%" if k >= 3 else "next start (3+ starts)",
    ]
    lines = tabulate(body, headers=headers, tablefmt="plain", disable_numparse=True).splitlines()
    keys = [f"start {i + 1}: {n}" for i, n in enumerate(names)]
    warn = [f"warning: {w}" for w in st.warnings(sweeps, names)]
    notes = [f"note: {n}" for n in st.notes(sweeps, names, resolve(sweeps, root))]
    return [*lines, "", *keys, *warn, *notes, st.summary(rows, k)]


def _git(root: Path, *args: str, env: dict | None = None, stdin: str | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, env=env, input=stdin, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def resolve(sweeps: list[dict], root: Path, depth: int = 50) -> list[st.Resolved | None]:
    """For each sweep git called dirty whose files' tree it recorded (``git_tree``, since 2026-12-06): the
    commit whose files they were, and the untracked paths beside them that no commit holds; else None. A
    commit's tree matches at once; with untracked files (``git_untracked``), each of the newest ``depth``
    commits' trees plus those of them it lacks is tried. Branches and tags only: a stash is no commit of the
    code."""
    if not any(m.get("git_dirty") and m.get("git_tree") for m in sweeps):
        return [None] * len(sweeps)
    log = (_git(root, "log", "--exclude=refs/stash", "--all", "--format=%T %H") or "").split()
    commits, trees = log[1::2], {}
    for tree, commit in zip(log[::2], commits, strict=True):  # newest first: a tree two commits share names the newer
        trees.setdefault(tree, commit)
    out: list[st.Resolved | None] = []
    for m in sweeps:
        tree, extra = m.get("git_tree"), m.get("git_untracked") or []
        if not (m.get("git_dirty") and tree):
            out.append(None)
        elif tree in trees:
            out.append((trees[tree], []))
        else:
            out.append(_with_untracked(root, tree, extra, commits[:depth]) if extra else None)
    return out


def _with_untracked(root: Path, tree: str, extra: list, commits: list[str]) -> st.Resolved | None:
    """The commit whose tree, with the untracked files it lacks added, is ``tree``; and those files."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(d) / "index")}
        for commit in commits:
            if _git(root, "read-tree", commit, env=env) is None:
                continue
            have = set((_git(root, "ls-files", "-z", "--", *(p for _, _, p in extra), env=env) or "").split("\0"))
            add = [(mode, blob, p) for mode, blob, p in extra if p not in have]
            info = "".join(f"{mode} {blob}\t{p}\n" for mode, blob, p in add)
            if add and _git(root, "update-index", "--add", "--index-info", env=env, stdin=info) is None:
                continue
            if (_git(root, "write-tree", "--missing-ok", env=env) or "").strip() == tree:
                return commit, [p for _, _, p in add]
    return None


# experiments/<name>/starts.json: {"about": text, "starts": [metrics.json paths, repo-relative],
# "md5": {path: md5 of that file}}
RECORD = "starts.json"


def experiment_dir(src: str, root: Path) -> Path | None:
    """The reported experiment a source names, NAME or experiments/NAME: its record applies. A metrics.json
    path is that file alone (so a command over named files shows what it names), else None."""
    p = Path(src)
    if not p.exists() and "/" not in src and (root / "conf" / "experiment" / f"{src}.yaml").is_file():
        p = root / "experiments" / src
    p = p.resolve()
    return p if p.is_dir() and p.parent == (root / "experiments").resolve() and (p / "metrics.json").is_file() else None


def read_metrics(path: Path, what: str) -> dict:
    """A metrics.json file (``metrics_json.read``), or an error naming it and what it lacks."""
    try:
        return metrics_json.read(path)
    except ValueError as e:
        raise SystemExit(f"{what}: {e}") from None


def recorded(exp: Path, root: Path) -> list[str]:
    """The other starts an experiment records (repo-relative metrics.json paths); [] when none."""
    f = exp / RECORD
    if not f.is_file():
        return []
    try:
        body = json.loads(f.read_text())
    except ValueError as e:
        raise SystemExit(f"{f}: not JSON ({e}); fix it, or delete it and record the starts again") from None
    body = body if isinstance(body, dict) else {}
    sums, paths = body.get("md5") or {}, body.get("starts")
    if not isinstance(paths, list) or not all(isinstance(x, str) for x in paths):
        raise SystemExit(f'{f}: needs {{"starts": [metrics.json paths relative to the repository root]}}')
    if missing := [x for x in paths if not (root / x).is_file()]:
        raise SystemExit(f"{f}: recorded start {missing[0]} not found: restore the file or drop it from the list")
    # the report stage depends on starts.json only: a recorded file that changed would leave its facts stale
    if changed := [x for x in paths if sums.get(x) != md5(root / x)]:
        raise SystemExit(
            f"{f}: recorded start {changed[0]} is not the file that was recorded (its md5 differs or is missing): "
            "restore it (git checkout), or drop it from the list and record it again"
        )
    return paths


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def record(exp: Path, new: list[str], root: Path) -> list[str]:
    """Add sweeps to an experiment's recorded starts, after checking they are metrics.json files the
    repository keeps (inside it, not ignored by git), not yet recorded, and one design with the experiment
    (``analysis.starts.not_one_design``). Record every start of the design, inside the interval or not: a
    record of only the starts that agree would narrow the interval below what starts do. Returns what to
    print: the record written, then what to do next."""
    rel = []
    for src in new:
        p = Path(src).resolve()
        if not p.exists():
            raise SystemExit(f"starts --record: {src} not found (a metrics.json path, from {Path.cwd()})")
        if not p.is_file() or p.suffix != ".json":
            raise SystemExit(
                f"starts --record: {src} is not a metrics.json file (the record keeps file paths; for a sweep dir, "
                "write its metrics.json into docs/data/ as the experiment's README shows)"
            )
        try:
            rel.append(str(p.relative_to(root.resolve())))
        except ValueError:
            raise SystemExit(
                f"starts --record: {src} is outside the repository ({root}); copy it in, e.g. docs/data/"
            ) from None
        ignored = subprocess.run(["git", "check-ignore", "-q", rel[-1]], cwd=root, capture_output=True, text=True)
        if ignored.returncode not in (0, 1):
            raise SystemExit(f"starts --record: git cannot say whether {rel[-1]} is kept: {ignored.stderr.strip()}")
        if ignored.returncode == 0:
            raise SystemExit(f"starts --record: {rel[-1]} is ignored by git; copy it to a kept path, e.g. docs/data/")
    paths = recorded(exp, root)
    if dup := [x for x in rel if x in paths]:
        raise SystemExit(f"starts --record: {dup[0]} is already recorded in experiments/{exp.name}/{RECORD}")
    names = [str((exp / "metrics.json").relative_to(root.resolve())), *paths, *rel]
    sweeps = [read_metrics(root / n, "starts --record") for n in names]
    if bad := st.not_one_design(sweeps, names):
        raise SystemExit("starts --record: not one design, nothing recorded:\n  " + "\n  ".join(bad))
    write(exp, paths + rel, root)
    out = [
        f"recorded: experiments/{exp.name}/{RECORD} ({len(paths) + len(rel) + 1} starts with its metrics.json)",
        f"next: dvc repro report@{exp.name} (the README facts carry the record)",
    ]
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", *rel], cwd=root, capture_output=True)
    if tracked.returncode != 0:
        out.append(
            f"note: commit the recorded files with experiments/{exp.name}/{RECORD} (git add {' '.join(rel)}): a clone "
            "without them fails"
        )
    return out


def write(exp: Path, paths: list[str], root: Path) -> None:
    """starts.json: the paths and each file's md5 (a changed file is caught where the record is read)."""
    about = "this experiment's other machine starts (metrics.json is start 1); `starts NAME SWEEP --record` adds one"
    body = {"about": about, "starts": paths, "md5": {x: md5(root / x) for x in paths}}
    (exp / RECORD).write_text(json.dumps(body, indent=2) + "\n")


def of_experiment(src: str, root: Path) -> tuple[list[dict], list[str]]:
    """An experiment's metrics.json and its recorded starts, with their names; ([], []) for another source."""
    exp = experiment_dir(src, root)
    if exp is None:
        return [], []
    names = [str((exp / "metrics.json").relative_to(root.resolve())), *recorded(exp, root)]
    return [read_metrics(root / n, "starts") for n in names], names


class Judged(NamedTuple):
    """What ``compare`` judges B by: A's next-start intervals (none: the rerun interval, or the CI), the notes
    that say why, and whether B is of another design than the experiment A (then no hint about starts)."""

    intervals: dict[str, tuple[float, float]]
    notes: list[str]
    other_design: bool = False


def for_compare(src: str, reported: dict, b: dict, root: Path) -> Judged:
    """A's next-start intervals when A is an experiment with recorded starts (NAME or experiments/NAME; the
    reported metrics.json, at the revision compared, is start 1), and the notes that say so. A recorded start
    that B is (the same measurement) is left out of the interval B is judged by; a record that is not one
    design with A (another --rev, a re-measured metrics.json) gives no interval, with the reason."""
    sweeps, names = of_experiment(src, root)
    if not sweeps:
        return Judged({}, [])
    if len(sweeps) == 1:  # nothing recorded: only a cell or an axis tells another design (A may be cheap-mode)
        if why := st.other_design(reported, b):
            return Judged({}, [f"note: B is not one design with {names[0]} ({why}): not a start of it"], True)
        return Judged({}, [f"next-start intervals: none ({names[0]} records no other start; 3 starts give one)"])
    if other := [(k, w) for k, w in st.problems([reported, b], [names[0], "B"]) if k in (st.DESIGN, st.BLOCKS)]:
        why = f"note: B is not one design with {names[0]} ({other[0][1].removeprefix('B: ')}): not a start of it, so"
        return Judged({}, [why + " its record does not apply"], other[0][0] == st.DESIGN)
    sweeps[0] = reported
    notes, same = [], set()
    for i, m in enumerate(sweeps[1:], 1):
        shared = len(b["jobs"]) if m.get("jobs") == b.get("jobs") else st.same_measurement(m, b)
        if shared:
            same.add(i)
            what = (
                "holds the same jobs as"
                if shared == len(b["jobs"])
                else f"shares {shared} of {len(b['jobs'])} jobs' measurements with"
            )
            notes.append(f"note: B {what} recorded start {i + 1} ({names[i]}): left out of the interval B is judged by")
    sweeps, names = (
        [m for i, m in enumerate(sweeps) if i not in same],
        [n for i, n in enumerate(names) if i not in same],
    )
    got, bad = st.recorded_intervals(sweeps, names)
    if bad:
        why = f"warning: the record of {names[0]} is not one design ({bad}): judged by the rerun interval"
        return Judged({}, [*notes, why])
    if not got:
        why = f"next-start intervals: none ({len(sweeps)} starts; 3 are needed): judged by the rerun interval"
        return Judged({}, [*notes, why])
    where = f"{names[0]}'s record ({', '.join(names[1:])})"
    why = f"next-start intervals: from {len(sweeps)} machine starts, {where}; never narrower than the rerun interval"
    return Judged(got, [*notes, why])


def gather(sources: list[str], record_them: bool, root: Path, load) -> tuple[list[dict], list[str]]:
    """The sweeps ``starts`` shows, with their names: an experiment (NAME first) brings its metrics.json and
    recorded starts, then the sweeps given (``load``: a source -> metrics.json dict); ``record_them`` first
    adds the given sweeps to the experiment's record. ValueError (a usage error) when there is nothing to compare."""
    exp = experiment_dir(sources[0], root)
    if record_them:
        if exp is None:
            raise ValueError(f"starts --record: {sources[0]} is not a reported experiment (NAME or experiments/NAME)")
        if len(sources) < 2:
            raise ValueError("starts --record: give the sweeps to record after the experiment (metrics.json files)")
        print("\n".join(record(exp, sources[1:], root)))
    if exp is None and len(sources) < 2:
        src = sources[0]
        why = (
            f"{src} is one sweep: a metrics.json path is that file alone; name the experiment to bring its record"
            if "/" in src or src.endswith(".json")
            else f"no experiments/{src} with a metrics.json under {root}; run from the repository root or set DVC_ROOT"
        )
        raise ValueError(
            "starts takes two or more sweeps of one design (three or more for the next-start interval), "
            f"or an experiment that records its starts ({why})"
        )
    sweeps, names = of_experiment(sources[0], root)
    kept = {(root / n).resolve() for n in names} | ({exp} if exp else set())  # a start given again: shown once
    given = [
        s
        for s in ([] if record_them else sources[1 if exp else 0 :])
        if (experiment_dir(s, root) or Path(s).resolve()) not in kept
    ]
    sweeps, names = sweeps + [load(src) for src in given], names + given
    if len(sweeps) < 2:
        raise ValueError(
            "starts takes two or more sweeps of one design (three or more for the next-start interval), or an "
            + (
                f"experiment that records its starts; {sources[0]} records none: add them with `starts {sources[0]} SWEEP --record`"
                if exp
                else "experiment that records its starts"
            )
        )
    return sweeps, names


def hints(rows: list, judged: Judged) -> list[str]:
    """What ``compare`` says about a rebuilt cell outside the interval it was judged by (``cmp.Row``s); nothing
    about starts where B is of another design than the experiment A."""
    out: list[str] = []
    if judged.other_design:
        return out
    if far := [r.cell for r in rows if r.inside is False and r.judged_by == "next-start interval"]:
        out.append(
            f"outside the next-start interval: {', '.join(far[:4])}{', ...' if len(far) > 4 else ''}. Launch noise "
            "and a start's shift together put a new start there 5% of the time: look for a change (code, driver, "
            "clocks, load); with none found, record it all the same (a record of only the starts that agree narrows "
            "the interval below what starts do)"
        )
    if near := [r.cell for r in rows if r.inside is False and r.judged_by == "rerun interval"]:
        out.append(  # the interval holds one start's launch noise: more starts tell a start's shift from a change
            f"outside the rerun interval: {', '.join(near[:4])}{', ...' if len(near) > 4 else ''}. A machine start "
            "can move a cell by more than one start's launches vary: measure more starts and test for it with "
            "python -m spec_decode.views.experiment starts SWEEP_1 SWEEP_2 SWEEP_3; recorded (starts NAME SWEEP "
            "--record), 3 starts give the next-start interval that compare NAME B judges by"
        )
    return out


def facts(exp: Path, metrics: dict, root: Path) -> list[str]:
    """The report's lines on an experiment's record: each spec cell's next-start interval as ``compare``
    judges by it (widened to the rerun interval), or how many starts are recorded when too few for one."""
    names = recorded(exp, root)
    if not names:
        return []
    k = len(names) + 1
    sweeps = [metrics, *(read_metrics(root / n, "report") for n in names)]
    got, bad = st.recorded_intervals(sweeps, ["this metrics.json", *names])
    if bad:  # a re-measured metrics.json
        return [f"- machine starts: {RECORD} is not one design with this metrics.json ({bad}); no interval"]
    if not got:
        return [f"- machine starts: {k} (this metrics.json and {RECORD}); 3 give a next-start interval"]
    cells = cmp.entries(metrics)
    return [
        f"- next-start interval (95%: where a rebuild on another machine start lands, from {k} starts: this "
        f"metrics.json and {RECORD}; `compare` judges by it): "
        + ", ".join(
            f"[{lo:.3f}, {hi:.3f}] at {cell}"
            for cell, (lo, hi) in ((c, cmp.widened(i, cmp.rerun_of(cells.get(c, {})))) for c, i in sorted(got.items()))
        )
    ]


if __name__ == "__main__":  # the library behind a subcommand
    from spec_decode.core.errors import run_as

    run_as(__spec__.name, "spec-decode experiment starts", "spec_decode.views.experiment starts")
