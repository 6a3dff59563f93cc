"""One design measured on several machine starts: the shift a start adds, which one sweep's rerun interval
leaves out (issue 41; docs/reproducibility.md, "What it does not hold").

A block-design sweep's intervals are built from its own launches (``analysis.blocks``): they hold a rebuild
that sees the same launch-to-launch noise. A lent GPU comes back as a fresh machine start, perhaps another
machine, and a start can move a cell by more than its launches vary. Given k sweeps of one design, each from
its own start, per spec cell (the speedups' logs; each start's value is its blocks' geometric mean):

- **the starts' values** and the sd of their logs, ``s_b``;
- **a start effect or not**: one-way ANOVA of the block values with the start as the factor
  (``scipy.stats.f_oneway`` on the logs), F = the mean square between starts / the mean square within
  (launch to launch), df (k - 1, N - k); and Welch's version (``equal_var=False``), which does not assume
  that every start's launches spread alike (they do not: 0.06-0.28% on the H100 8B cell). The effect is
  *shown* when both p < 0.05: the starts' values vary more than launch noise alone explains. Where Welch's
  cannot be computed (a start with one launch, or launches that agree exactly) and the classic p < 0.05, the
  label says "classic only" and the cell is not counted as shown. Otherwise "not shown", never "absent": 2-3
  starts see only a large shift. A start whose cell has no value is left out of the test too; a cell with a
  failed block keeps the finished blocks' value (``blocks.fold``), with a warning. Needs block values (a
  block-design sweep); a cheap-mode sweep has one launch a cell and no within term.
- **where the next start's cell lands** (95%, k >= 3): the prediction interval on the logs,
  ``mean +- t_(k-1) * s_b * sqrt(1 + 1/k)``, s_b never below ``launch_floor``. It treats each start's value as one draw, launch noise and start
  shift together, so it holds whatever a start moves, for a next start with as many blocks as these; with
  k - 1 df it is wide (t_2 = 4.30) until more starts come.
- **one design**: the matched cells' axes (hardware, model, steps, ...) must agree across the sweeps, and two
  sweeps that share a job's measurement (``same_measurement``: its tok/s, sd and run count, to the digits
  metrics.json keeps; a copy renamed or re-exported with other keys too) are one measurement given twice;
  ``warnings`` names both, and a cell that is missing, not FINISHED or measured in fewer blocks than in the
  first sweep. Where the sweeps are not one design there is no test and no interval. ``notes`` names the
  sweeps whose code (``git_commit``) differs from the first's, or that ran from a tree with uncommitted
  changes: a code change may be part of a difference.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict

from spec_decode.analysis.blocks import drop_block
from spec_decode.analysis.compare import _is_baseline, entries
from spec_decode.analysis.stats import t_ppf
from spec_decode.core.gc_imports import frozen_imports

MIN_STARTS_FOR_INTERVAL = 3
ALPHA = 0.05


@dataclasses.dataclass
class Test:
    f: float
    p: float
    df: tuple[int, int]
    within_sd: float  # pooled launch-to-launch sd of the block logs
    p_welch: float | None  # None: a start with one launch or no spread (Welch needs a variance per start)

    @property
    def shown(self) -> bool:
        return self.p < ALPHA and self.p_welch is not None and self.p_welch < ALPHA

    @property
    def classic_only(self) -> bool:
        """The classic p < 0.05 where Welch's cannot be computed: not counted as shown."""
        return self.p < ALPHA and self.p_welch is None


@dataclasses.dataclass
class StartsRow:
    cell: str
    values: list[float | None]  # each start's speedup (None: the cell has no value in that sweep)
    between_sd: float | None = None  # sd of the starts' log speedups
    test: Test | None = None
    interval: tuple[float, float] | None = None  # the next start's cell, 95%
    judged: str = ""  # why there is no test: "" (none needed), "not one design"

    @property
    def effect(self) -> str:
        t = self.test
        if t is None:
            return f"no test ({self.judged or 'needs 2+ starts with block values that spread'})"
        welch = "; Welch not computable" if t.p_welch is None else f"; Welch p{fmt_p(t.p_welch)}"
        label = "shown" if t.shown else "classic only" if t.classic_only else "not shown"
        return f"{label} (F={t.f:.1f}, df {t.df[0]},{t.df[1]}, p{fmt_p(t.p)}{welch})"


def fmt_p(p: float) -> str:
    """``=0.0036`` or ``<0.001``: the relation and the value."""
    return f"={p:.2g}" if p >= 0.001 else "<0.001"


def block_values(metrics: dict) -> dict[str, list[float]]:
    """Each spec cell's per-block speedups (a block-design sweep's FINISHED jobs, as ``blocks.fold`` keeps
    them), keyed as ``compare.entries`` keys its cells; empty for a cheap-mode sweep (no within-start term)."""
    if not metrics.get("cells"):
        return {}
    groups: dict[str, list[float]] = defaultdict(list)
    for name, job in metrics["jobs"].items():  # baselines too: entries() keys a cell by what varies among all
        got = job.get("speedup_vs_baseline")
        keep = not _is_baseline(name, job) and got is not None and job.get("status", "FINISHED") == "FINISHED"
        groups[drop_block(name)] += [got] if keep else []
    return {k: v for k, v in entries({"cells": dict(groups)}).items() if v}


def anova(groups: list[list[float]]) -> Test | None:
    """One-way ANOVA on the logs, classic and Welch's; None without a within term (every start one launch)
    or with fewer than 2 starts."""
    logs = [[math.log(v) for v in g] for g in groups if g]
    k, n = len(logs), sum(map(len, logs))
    if k < 2 or n - k < 1:
        return None
    ss_w = sum((x - statistics.fmean(g)) ** 2 for g in logs for x in g)
    if ss_w == 0:
        return None
    with frozen_imports():  # scipy.stats: only this view pays for it
        from scipy import stats
    classic = stats.f_oneway(*logs)
    welch = None
    if all(len(g) >= 2 and statistics.variance(g) > 0 for g in logs):
        welch = float(stats.f_oneway(*logs, equal_var=False).pvalue)
    return Test(float(classic.statistic), float(classic.pvalue), (k - 1, n - k), math.sqrt(ss_w / (n - k)), welch)


def next_start(
    values: list[float], confidence: float = 0.95, floor: tuple[float, int] = (0.0, 0)
) -> tuple[float, float] | None:
    """Where the next start's value lands: the t prediction interval on the logs (k - 1 df), never narrower
    than the same interval on ``floor`` (``launch_floor``: the sd launch noise alone gives a start's value,
    with its df): the wider of the two."""
    if len(values) < MIN_STARTS_FOR_INTERVAL:
        return None
    logs = [math.log(v) for v in values]
    m, sd, k = statistics.fmean(logs), statistics.stdev(logs), len(logs)
    q = 0.5 + confidence / 2
    half = t_ppf(q, k - 1) * sd
    if floor[1]:
        half = max(half, t_ppf(q, floor[1]) * floor[0])
    half *= math.sqrt(1 + 1 / k)
    return math.exp(m - half), math.exp(m + half)


def launch_floor(groups: list[list[float]]) -> tuple[float, int]:
    """The sd of a start's value from launch noise alone, and its df: the pooled launch-to-launch sd of the
    block logs over the square root of a start's block count (N - k df). Three starts can agree far closer
    than their launches allow (embedded_h100_concurrency: 0.10% apart; launches 3.1% apart pooled, 5.3% in its
    third start): their sd alone gives an interval that a next start misses by launch noise alone.
    ``next_start`` takes the wider of the two intervals, so it is never narrower than the plain one.
    Simulated (3 starts of 3-4 blocks, 6000 designs, 2 seeds): with launch noise only, where the starts agree
    that closely, the plain interval held a 4th start 91-93% of the time, the floored 98%; over all designs
    95% and 99% (conservative). Start shift 2x launch noise: 95% either way over all designs. (0, 0) without a
    within term."""
    logs = [[math.log(v) for v in g] for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in logs)
    if not df:
        return 0.0, 0
    ss = sum((x - statistics.fmean(g)) ** 2 for g in logs for x in g)
    return math.sqrt(ss / df) / math.sqrt(statistics.fmean(len(g) for g in logs)), df


def _values(sweeps: list[dict]) -> dict[str, list[float | None]]:
    """Each spec cell of the first sweep: every sweep's speedup (None where it has none)."""
    cells = [entries(m) for m in sweeps]
    return {
        key: [(c.get(key) or {}).get("speedup_vs_baseline") for c in cells]
        for key, e in cells[0].items()
        if not _is_baseline(key, e)
    }


def _groups(blocks: list[dict[str, list[float]]], key: str, vals: list[float | None]) -> list[list[float]]:
    """A cell's block values per start (none for a start without the cell's value)."""
    return [b.get(key, []) if v is not None else [] for b, v in zip(blocks, vals, strict=True)]


def _next_start(vals: list[float | None], groups: list[list[float]]) -> tuple[float, float] | None:
    """A cell's next-start interval over the starts that have a value, floored by their launches."""
    return next_start([v for v in vals if v is not None], floor=launch_floor(groups))


def starts(sweeps: list[dict], names: list[str] | None = None) -> list[StartsRow]:
    """One row per spec cell of the first sweep: each sweep's value; where the sweeps are starts of one design,
    the start-effect test and the next-start interval (``problems``: over another block count the test only;
    over another design or one measurement given twice neither)."""
    kinds = {kind for kind, _ in problems(sweeps, names or [f"sweep {i + 1}" for i in range(len(sweeps))])}
    test, interval = not kinds & {TWICE, DESIGN}, not kinds & {TWICE, DESIGN, BLOCKS}
    blocks = [block_values(m) for m in sweeps]
    rows = []
    for key, vals in _values(sweeps).items():
        row = StartsRow(key, vals)
        got = [v for v in vals if v is not None]
        if len(got) >= 2:
            row.between_sd = statistics.stdev(math.log(v) for v in got)
        groups = _groups(blocks, key, vals)
        row.interval = _next_start(vals, groups) if interval else None
        if test and sum(bool(g) for g in groups) >= 2:
            row.test = anova(groups)
        row.judged = "" if test else "not one design"
        rows.append(row)
    return rows


def intervals(sweeps: list[dict]) -> dict[str, tuple[float, float]]:
    """Each spec cell's next-start interval (keyed as ``compare.entries``), where 3+ starts have a value: what
    ``compare`` judges a rebuild by when an experiment records its starts. No test is run (no scipy)."""
    blocks = [block_values(m) for m in sweeps]
    got = {key: _next_start(vals, _groups(blocks, key, vals)) for key, vals in _values(sweeps).items()}
    return {key: i for key, i in got.items() if i}


def recorded_intervals(sweeps: list[dict], names: list[str]) -> tuple[dict[str, tuple[float, float]], str | None]:
    """An experiment's record (its metrics.json first) as ``compare`` and the report use it: the next-start
    intervals, or none with the reason (not one design: the first such problem; fewer than 3 starts: None)."""
    if bad := not_one_design(sweeps, names):
        return {}, bad[0]
    return intervals(sweeps), None


def _axes_diff(x: dict, y: dict) -> str:
    """The axes both sides record with different values (an axis one side lacks was not recorded there: an
    older writer, e.g. benchmark.concurrency before issue 28; not a difference)."""
    return ", ".join(f"{k} {x[k]!r} vs {y[k]!r}" for k in sorted(x.keys() & y.keys()) if x[k] != y[k])


def other_design(a: dict, b: dict) -> str | None:
    """Why ``b`` is no start of ``a``'s design: a spec cell of ``a`` it lacks, or one whose axes differ (another
    card, model or setting); None when every cell is there with the same axes."""
    ca, cb = entries(a), entries(b)
    for key, e in ca.items():
        if _is_baseline(key, e):
            continue
        if key not in cb:
            return f"no cell {key!r}"
        if what := _axes_diff(e.get("axes") or {}, cb[key].get("axes") or {}):
            return f"cell {key!r} differs in {what}"
    return None


def not_one_design(sweeps: list[dict], names: list[str]) -> list[str]:
    """The warnings that make sweeps unfit to record, or to judge by, as one design's starts: the same jobs
    twice, a missing cell, differing axes, another block count or none (a cheap-mode sweep). A failed block is
    a condition of a start and is kept."""
    return [w for kind, w in problems(sweeps, names) if kind != CONDITION]


def warnings(sweeps: list[dict], names: list[str]) -> list[str]:
    """What makes the sweeps not k starts of one design (``problems``), as lines."""
    return [w for _, w in problems(sweeps, names)]


TWICE, DESIGN, BLOCKS, CONDITION = "twice", "design", "blocks", "condition"


def problems(sweeps: list[dict], names: list[str]) -> list[tuple[str, str]]:
    """(kind, the line): ``TWICE``, one measurement given twice (the same jobs, or a job's measurement shared);
    ``DESIGN``, a spec cell of the first sweep missing in another, or whose axes differ (another card, model or
    setting); ``BLOCKS``, another block count than the first sweep's (unless the first's cell lost a block) or
    no block values (a cheap-mode sweep, the first's too); ``CONDITION``, a cell with a failed block. The first
    three make the sweeps no starts of one design; a start-effect test still runs over ``BLOCKS`` (one-way ANOVA
    takes unequal groups), the next-start interval does not."""
    out = []
    for i in range(len(sweeps)):
        for j in range(i):
            if sweeps[i].get("jobs") == sweeps[j].get("jobs"):
                out.append(
                    (
                        TWICE,
                        f"{names[i]} holds the same jobs as {names[j]}: one measurement given twice, not two starts",
                    )
                )
            elif shared := same_measurement(sweeps[j], sweeps[i]):
                out.append(
                    (
                        TWICE,
                        f"{names[i]} shares {shared} of {len(sweeps[i].get('jobs') or {})} jobs' measurements with "
                        f"{names[j]} (the same tok/s, sd and runs): one measurement given twice, not two starts",
                    )
                )
    cells, blocks = [entries(m) for m in sweeps], [block_values(m) for m in sweeps]
    c0 = cells[0]
    for key, e in c0.items():
        if _is_baseline(key, e):
            continue
        for i, (name, c, b) in enumerate(zip(names, cells, blocks, strict=True)):
            if key not in c:
                out.append((DESIGN, f"{name}: no cell {key!r} (a different design, or a partial sweep)"))
                continue
            if what := _axes_diff(e.get("axes") or {}, c[key].get("axes") or {}):
                out.append((DESIGN, f"{name}: cell {key!r} differs from {names[0]} in {what}: not one design"))
            n, n0 = len(b.get(key, [])), len(blocks[0].get(key, []))
            if c[key].get("status", "FINISHED") != "FINISHED":
                out.append(
                    (
                        CONDITION,
                        f"{name}: cell {key!r} is {c[key].get('status')} (a block did not finish): its value is "
                        f"the finished blocks' ({n})",
                    )
                )
            elif not n:
                out.append((BLOCKS, f"{name}: cell {key!r} has no block values (a cheap-mode sweep): no within term"))
            elif i and n != n0 and c0.get(key, {}).get("status", "FINISHED") == "FINISHED":  # a failed first: kept
                out.append(
                    (
                        BLOCKS,
                        f"{name}: cell {key!r} has {n} blocks, {names[0]} {n0}: the next-start interval assumes "
                        "equal block counts",
                    )
                )
    return out


def same_measurement(a: dict, b: dict) -> int:
    """How many of ``b``'s jobs carry a measurement of ``a``'s: the same tok/s, sd and run count (a job that
    measured something). Two starts never agree to the digits metrics.json keeps on all three; a copy of a
    sweep does, whatever it was renamed to or whatever keys were added."""

    def keys(m: dict) -> list[tuple]:
        jobs = (m.get("jobs") or {}).values()
        got = [
            tuple(j.get(k) for k in ("throughput_tok_s", "throughput_tok_s_std", "throughput_tok_s_n")) for j in jobs
        ]  # a one-run job's sd is nan, which equals nothing: compared by its text
        return [tuple("nan" if v != v else v for v in k) for k in got if None not in k]

    seen = set(keys(a))
    return sum(k in seen for k in keys(b))


Resolved = tuple[str, list[str]]  # the commit a sweep's files were, and the untracked paths no commit holds


def ran(m: dict, resolved: Resolved | None) -> tuple[str | None, bool]:
    """(the commit a sweep's files were, dirty?): a dirty sweep whose files' tree names a commit
    (``resolved``, from ``views.starts.resolve``) counts as that commit, the untracked extras said apart."""
    if m.get("git_dirty") and resolved is not None:
        return resolved[0], False
    return m.get("git_commit"), bool(m.get("git_dirty"))


def notes(sweeps: list[dict], names: list[str], resolved: list[Resolved | None] | None = None) -> list[str]:
    """The sweeps measured at another commit than the first, or from a tree with uncommitted changes: a code
    change may be part of a difference. A dirty sweep whose files' tree is a commit's (``resolved``) counts as
    that commit and is said to be, with the untracked files it had beside them."""
    resolved = resolved or [None] * len(sweeps)
    got = [ran(m, r) for m, r in zip(sweeps, resolved, strict=True)]
    first = got[0][0]
    out = [
        f"{name} was measured at {str(c)[:7]}, {names[0]} at {str(first)[:7]}: a code change may be part of a difference"
        for name, (c, _) in zip(names[1:], got[1:], strict=True)
        if first and c and c != first
    ]
    for name, m, r in zip(names, sweeps, resolved, strict=True):
        if m.get("git_dirty") and r is not None:
            said = m.get("git_commit")
            said = f"the records say {said[:7]} with uncommitted changes" if said else "the records name no commit"
            extra = f", plus {len(r[1])} untracked file(s) no commit holds: {', '.join(r[1][:3])}" if r[1] else ""
            out.append(
                f"{name}: its files were commit {r[0][:7]}'s ({said}; the tree of its files names the commit){extra}"
            )
    if dirty := [n for n, (_, d) in zip(names, got, strict=True) if d]:
        out.append(
            f"{', '.join(dirty)}: measured from a tree with uncommitted changes (git_dirty): its code is not its commit alone"
        )
    return out


def summary(rows: list[StartsRow], k: int) -> str:
    """One line: how many cells show a start effect, and what that means for the rerun interval."""
    if rows and all(r.judged for r in rows):
        return f"{k} sweeps that are not one design (the warnings above): no start-effect test, no next-start interval"
    tested = [r for r in rows if r.test is not None]
    shown = [r for r in tested if r.test.shown]
    classic = sum(r.test.classic_only for r in tested)
    head = f"{k} starts, {len(rows)} spec cell(s): a start effect shown in {len(shown)} of {len(tested)} tested"
    head += f" ({classic} more by the classic test only, Welch's not computable)" if classic else ""
    if not tested:
        return head.split(":")[0] + ": no cell has block values that spread from 2+ starts (no test)"
    if shown:
        return head + (
            " (both p < 0.05): there the starts' values vary more than launch noise alone explains, so a rerun "
            "interval from one start (launch noise only) is too narrow for a rebuild on another start"
            + ("; the next-start interval holds both" if any(r.interval for r in rows) else "")
        )
    return head + " (not shown is not absent: a few starts see only a large effect)"
