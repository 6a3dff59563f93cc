"""Two measurements of the same sweep, cell by cell, with a verdict (issue 25).

Inputs are two metrics.json-shaped dicts (``views.metrics_json.to_metrics``: ``{"jobs": {key: entry},
"cells": {...} (block design), "host": fingerprint}``): reported vs rebuilt, or sweep A vs sweep B.
Per cell (the block design's cells where both sides have them, else the jobs):

- spec cells: the 95% speedup intervals **overlap** or not (two overlapping 95% intervals are not
  evidence of a difference; disjoint ones are, at roughly the 0.6% level for equal widths; where A records
  its machine starts, B's speedup **inside A's next-start interval** or not, below), and the
  accept length is **equal** or not (greedy decoding of the same weights and prompt gives the same
  tokens: a different accept length means a different drafter, target, prompt or engine, not noise;
  ``ACCEPT_TOL`` allows GPU kernels' last-digit nondeterminism);
- baselines: their tok/s ratio, for information only (absolute throughput follows the host's load; the
  product's claims are speedups);
- a cell present on one side only differs.

Where A's design was measured on several machine starts (``start_intervals``: each spec cell's next-start
interval, ``analysis.starts``), B's speedup is judged by that interval, which holds a start's shift as well as
launch noise, widened to A's rerun interval where that is wider (a few starts may agree more closely than one
start's launches); else by A's rerun interval (one start's launch noise), else by A's CI.

``verdict(rows)`` is "agree" or "DIFFER" (the CLI exits 1 on DIFFER); the hosts' differences are named
(``host_differences`` on the fingerprints of ``runner.machine``) and each side's load during its timed runs is shown beside it.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from spec_decode.analysis.blocks import ci_holds_a_rebuild, drop_block
from spec_decode.core.identity import SPEC_ITEM

# What a comparison names when it differs (the load is a condition of the run, reported beside it).
IDENTITY = ("cpu_model", "isa", "logical_cores", "usable_cores", "physical_cores", "hypervisor", "mem_gib")
GPU_IDENTITY = ("name", "driver_version", "clocks.max.sm")


def host_differences(a: dict | None, b: dict | None) -> list[str]:
    """The fingerprint fields that differ, as ``field: A vs B`` (an unknown side is named as such)."""
    if not a or not b:
        return (
            []
            if a == b
            else ["host fingerprint: " + ("missing on the first side" if not a else "missing on the second side")]
        )
    out = [f"{k}: {a.get(k)} vs {b.get(k)}" for k in IDENTITY if a.get(k) != b.get(k)]
    ga, gb = a.get("gpus") or [], b.get("gpus") or []
    if len(ga) != len(gb):
        out.append(f"gpus: {len(ga)} vs {len(gb)}")
    for i, (x, y) in enumerate(zip(ga, gb)):
        out += [f"gpu{i} {k}: {x.get(k)} vs {y.get(k)}" for k in GPU_IDENTITY if x.get(k) != y.get(k)]
    if a.get("nccl_version") != b.get("nccl_version"):
        out.append(f"nccl_version: {a.get('nccl_version')} vs {b.get('nccl_version')}")
    return out


# Hydra's override_dirname joins "key=value" items with ","; values may hold commas ([a,b]) (as runner.job)
_ITEM = re.compile(r",(?=[+~]*[\w./@-]+=)")
ACCEPT_TOL = 0.005  # relative: the embedded engine repeats accept lengths to 4 places; GPU kernels may not


@dataclass
class Row:
    cell: str
    role: str
    a: str  # the figure on each side, formatted
    b: str
    accept: str
    verdict: str  # "agree" | "info" | "DIFFERS: ..."
    inside: bool | None = None  # B's speedup inside the interval named by judged_by (issue 25's count)
    inside_ci: bool | None = None  # B's speedup inside A's 95% CI
    judged_by: str = "CI"  # "next-start interval" (A's recorded starts), "rerun interval" (the block design), "CI"
    a_df: int | None = None  # the degrees of freedom of A's intervals (the block design: blocks - 1)

    @property
    def differs(self) -> bool:
        return self.verdict.startswith("DIFFERS")


def entries(metrics: dict) -> dict[str, dict]:
    """The cells of a sweep: the block design's folded cells where present, else its jobs; keyed by
    what varies inside the sweep (its axes: ``nccl=tuned,spec.steps=3``; ``baseline,nccl=tuned``), so
    two sweeps line up whatever fixed overrides each was run with (a fault launcher, runs=30) and a
    cheap-mode sweep lines up with a block-design one (block items dropped). What is fixed never includes
    the speculation items (spec.*, drafter): a sweep with baseline jobs (benchmark.paired=false, whose
    names lack them) and one whose baselines ran paired (no baseline jobs: spec.steps=3 may be in every
    job) name their spec cells alike."""
    raw = {drop_block(k): v for k, v in (metrics.get("cells") or metrics["jobs"]).items()}
    items = {k: [p for p in _ITEM.split(k) if p and p != "baseline"] for k in raw}
    common = {p for p in set.intersection(*map(set, items.values())) if not SPEC_ITEM.match(p)} if items else set()
    out = {}
    for k, v in raw.items():
        key = ",".join(
            (["baseline"] if k.split(",", 1)[0] == "baseline" else []) + [p for p in items[k] if p not in common]
        )
        out[key or k] = v
    return out


def _is_baseline(key: str, e: dict) -> bool:
    return e.get("role", "baseline" if key.split(",", 1)[0] == "baseline" else "spec") == "baseline"


def paired(metrics: dict) -> bool:
    """Whether the sweep measured its baselines paired (beside each spec server: no baseline jobs)."""
    cells = entries(metrics).items()
    return not any(_is_baseline(k, e) for k, e in cells) and any(e.get("speedup_method") == "paired" for _, e in cells)


def _ci(e: dict, name: str, kind: str = "ci95") -> tuple[float, float] | None:
    lo, hi = e.get(f"{name}_{kind}_lo"), e.get(f"{name}_{kind}_hi")
    if lo is None or hi is None or lo != lo or hi != hi:
        return None
    return lo, hi


def _fmt(e: dict, name: str, spec: str) -> str:
    ci = _ci(e, name)
    return f"{e[name]:{spec}}" + (f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else " [no interval]")


def rerun_of(e: dict) -> tuple[float, float] | None:
    """A cell's 95% rerun interval of the speedup (the block design), else None."""
    return _ci(e, "speedup_vs_baseline", "rerun95")


def widened(start: tuple[float, float] | None, rerun: tuple[float, float] | None) -> tuple[float, float] | None:
    """A next-start interval, never narrower than the rerun interval: a next start carries at least one start's
    launch noise, and a few starts may agree more closely than that."""
    if start is None or rerun is None:
        return start
    return min(start[0], rerun[0]), max(start[1], rerun[1])


def compare_cell(key: str, a: dict | None, b: dict | None, start: tuple[float, float] | None = None) -> Row:
    if a is None or b is None:
        return Row(
            key,
            (a or b or {}).get("role", "?"),
            "-" if a is None else "present",
            "-" if b is None else "present",
            "-",
            f"DIFFERS: only in {'B' if a is None else 'A'}",
        )
    role = a.get("role") or ("baseline" if key.startswith("baseline") else "spec")
    if a.get("status", "FINISHED") != "FINISHED" or b.get("status", "FINISHED") != "FINISHED":
        return Row(key, role, a.get("status", "?"), b.get("status", "?"), "-", "DIFFERS: not FINISHED on both sides")
    acc_a, acc_b = a.get("accept_len"), b.get("accept_len")
    accept, same_accept = "-", True
    if acc_a is not None and acc_b is not None:
        same_accept = abs(acc_a - acc_b) <= ACCEPT_TOL * max(abs(acc_a), abs(acc_b))
        accept = f"{acc_a:.4f} vs {acc_b:.4f}" + ("" if same_accept else " (differs)")
    if "speedup_vs_baseline" in a and "speedup_vs_baseline" in b:
        ia, ib = _ci(a, "speedup_vs_baseline"), _ci(b, "speedup_vs_baseline")
        fa, fb = _fmt(a, "speedup_vs_baseline", ".3f"), _fmt(b, "speedup_vs_baseline", ".3f")
        if ia is None or ib is None:
            ia = ia or (a["speedup_vs_baseline"],) * 2
            ib = ib or (b["speedup_vs_baseline"],) * 2
        overlap = max(ia[0], ib[0]) <= min(ia[1], ib[1])
        shift = f"{100 * (b['speedup_vs_baseline'] / a['speedup_vs_baseline'] - 1):+.1f}%"
        rerun = rerun_of(a)
        start = widened(start, rerun)
        if start:  # A's starts show how far a start moves the cell: two starts' CIs may be disjoint by that much
            why = (
                []
                if start[0] <= b["speedup_vs_baseline"] <= start[1]
                else [f"outside the next-start interval ({shift})"]
            )
        else:
            why = [] if overlap else [f"speedup intervals disjoint ({shift})"]
        why += [] if same_accept else ["accept length differs"]
        in_ci = ia[0] <= b["speedup_vs_baseline"] <= ia[1]
        judge, by = (start, "next-start interval") if start else (rerun, "rerun interval") if rerun else (ia, "CI")
        label = f" (next start {start[0]:.3f}-{start[1]:.3f})" if start else ""
        label += f" (rerun {rerun[0]:.3f}-{rerun[1]:.3f})" if rerun and not start else ""
        return Row(
            key,
            role,
            fa + label,
            fb,
            accept,
            "DIFFERS: " + "; ".join(why) if why else "agree",
            judge[0] <= b["speedup_vs_baseline"] <= judge[1],
            in_ci,
            by,
            int(m.group(1)) if (m := re.search(r"t with (\d+) df", a.get("interval", ""))) else None,
        )
    if role == "baseline" and "throughput_tok_s" in a and "throughput_tok_s" in b:
        ratio = b["throughput_tok_s"] / a["throughput_tok_s"]
        return Row(
            key,
            role,
            _fmt(a, "throughput_tok_s", ".1f"),
            _fmt(b, "throughput_tok_s", ".1f"),
            accept,
            f"info: tok/s x{ratio:.3f} (a baseline's absolute speed follows the host's load)",
        )
    if not same_accept:
        return Row(key, role, "-", "-", accept, "DIFFERS: accept length differs")
    return Row(key, role, "-", "-", accept, "DIFFERS: no speedup on one side")


def compare(a: dict, b: dict, start_intervals: dict[str, tuple[float, float]] | None = None) -> list[Row]:
    """Cell by cell. A baseline job on one side only, where the other side measured its baselines paired,
    is shown for information: that side's baselines are inside its spec cells (the strategy is named by
    ``host_notes``), not missing. ``start_intervals``: A's next-start interval per cell (keyed as ``entries``)."""
    ea, eb = entries(a), entries(b)
    rows = []
    for k in sorted(set(ea) | set(eb)):
        row = compare_cell(k, ea.get(k), eb.get(k), (start_intervals or {}).get(k))
        other = b if k not in eb else a if k not in ea else None
        if other is not None and _is_baseline(k, ea.get(k) or eb[k]) and paired(other):
            row.verdict = f"info: a baseline job only in {'A' if other is b else 'B'} (the other side's ran paired)"
        rows.append(row)
    return rows


def verdict(rows: list[Row]) -> str:
    bad = [r for r in rows if r.differs]
    spec = [r for r in rows if r.role == "spec"]
    if bad:
        return f"DIFFER: {len(bad)} of {len(rows)} cell(s) differ ({', '.join(r.cell[:60] for r in bad[:4])}{', ...' if len(bad) > 4 else ''})"
    if any(r.judged_by == "next-start interval" for r in spec):
        return (
            f"agree: all {len(spec)} spec cell(s) agree: inside the next-start interval where the first side records "
            "its starts, else overlapping speedup intervals; equal accept lengths"
        )
    return f"agree: all {len(spec)} spec cell(s) have overlapping speedup intervals and equal accept lengths"


def coverage(rows: list[Row]) -> str | None:
    """``k of n B speedups inside A's 95% rerun interval`` (the issue's rerun criterion; stricter than
    overlap), and inside A's CI, which even a perfect CI holds only ~89% of the time at 4 blocks
    (``blocks.ci_holds_a_rebuild``: 86% at 8)."""
    judged = [r for r in rows if r.inside is not None]
    if not judged:
        return None
    by = {r.judged_by for r in judged}
    if by == {"CI"}:
        return f"coverage: {sum(r.inside for r in judged)} of {len(judged)} speedups of B inside A's 95% interval"
    ci = f"{sum(bool(r.inside_ci) for r in judged)} of {len(judged)} inside A's 95% CI, which holds an equal-size rebuild (its launch noise alone) {ci_note(judged)}"
    rerun = "rerun interval (where an equal-size rebuild lands with 95% at A's launch-to-launch noise; a machine start's own shift is not in it)"
    starts = [r for r in judged if r.judged_by == "next-start interval"]
    rest = [r for r in judged if r.judged_by != "next-start interval"]
    if not starts:
        return f"coverage: {sum(r.inside for r in judged)} of {len(judged)} speedups of B inside A's 95% {rerun}; {ci}"
    parts = [
        f"{sum(r.inside for r in starts)} of {len(starts)} speedups of B inside A's 95% next-start interval (where a "
        "rebuild on another machine start lands, from A's recorded starts: launch noise and a start's shift together)"
    ]
    for by, text in (("rerun interval", rerun), ("CI", "interval")):
        got = [r for r in rest if r.judged_by == by]
        parts += [f"{sum(r.inside for r in got)} of {len(got)} inside A's 95% {text}"] if got else []
    return f"coverage: {'; '.join(parts)}; {ci}"


def ci_note(judged: list[Row]) -> str:
    """How often a CI holds an equal-size rebuild, for A's degrees of freedom."""
    dfs = sorted({r.a_df for r in judged if r.a_df})
    if not dfs:
        return "short of 95% of the time"
    return ", ".join(f"~{100 * ci_holds_a_rebuild(df):.0f}% of the time at {df + 1} blocks" for df in dfs)


def _loads(metrics: dict) -> list[float]:
    return [e["host_load1"] for e in metrics["jobs"].values() if "host_load1" in e]


def load_note(metrics: dict) -> str:
    """The median and max 1-minute load of a side's timed runs (recorded since issue 25)."""
    loads = _loads(metrics)
    if not loads:
        return "load not recorded"
    return f"load (1 min) median {statistics.median(loads):.1f}, max {max(loads):.1f}"


def load_difference(a: dict, b: dict) -> str | None:
    """A note when the two sides ran at loads half a machine apart (median 1-minute load over the timed
    runs, differing by half the usable cores or more). On a 2-core VM the embedded engine's speedups moved
    with the load: an 8-block run at load 3.4 had 4 of 8 cells outside the rerun intervals of one at load
    1.0 (docs/reproducibility.md). No interval covers that: it is a condition of the run, like the CPU."""
    la, lb = _loads(a), _loads(b)
    cores = (a.get("host") or {}).get("usable_cores") or (b.get("host") or {}).get("usable_cores")
    if not la or not lb or not cores:
        return None
    ma, mb = statistics.median(la), statistics.median(lb)
    if abs(ma - mb) < cores / 2:
        return None
    return (
        f"loads differ: median {ma:.1f} vs {mb:.1f} on {cores} usable cores; the speedup moves with the "
        "host's load, which no interval covers (rerun at the reported load to judge coverage)"
    )


def host_notes(a: dict, b: dict) -> list[str]:
    diffs = host_differences(a.get("host"), b.get("host"))
    out = [f"hosts differ: {d}" for d in diffs] if diffs else ["hosts: same fingerprint"]
    if loads := load_difference(a, b):
        out.append(loads)
    if paired(a) != paired(b):
        out.append(
            "baselines: "
            + " vs ".join("paired beside each spec server" if paired(m) else "baseline jobs" for m in (a, b))
            + " (the speedup's method differs too)"
        )
    out += [
        f"A: {load_note(a)}; interval: {a.get('interval', 'runs within one launch (not recorded)')}",
        f"B: {load_note(b)}; interval: {b.get('interval', 'runs within one launch (not recorded)')}",
    ]
    return out
