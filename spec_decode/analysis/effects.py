"""Which axes of a sweep mattered, judged by intervals (issue 44). Pure: job records in, one verdict per axis.

A sweep such as ``spec.steps=1,2,3,5 nccl=tuned,default`` asks two questions; a table of eight cells
answers neither by itself (on a CPU, where nothing uses NCCL, a plot still draws ``tuned`` above
``default`` somewhere, by noise). For each axis (an override key with more than one value among the
cells) the cells are matched on every other axis, and the arms of each matched point are compared by
their 95% intervals (of ``speedup_vs_baseline`` where every cell has one, else of ``throughput_tok_s``):

- every pair of arms overlaps at every matched point: "no effect detected here (A/A)" -- the axis acted
  as an A/A control; an effect smaller than the intervals is not excluded;
- some pair is disjoint: "an effect", with the points and intervals that show it.

Overlap is the conservative reading (two overlapping 95% intervals can still differ at 5%); disjoint
intervals are a difference at well below 5%. The recommendation (``analysis.recommend``) then says
which step count, where the data can tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spec_decode.analysis.control import CPU_NO_NCCL, nccl_inert
from spec_decode.core.identity import override_items

if TYPE_CHECKING:  # the record's type only (the record sits a floor above)
    from spec_decode.record.results import JobRecord


@dataclass
class AxisEffect:
    axis: str  # the override key (nccl, spec.steps, ...)
    values: list[str]
    score_name: str  # the metric whose 95% intervals were compared
    points: int = 0  # matched points: cells equal on every other axis, >= 2 values of this one
    differ: list[str] = field(default_factory=list)  # "at spec.steps=3: tuned [..] vs default [..]" per disjoint pair
    differ_points: int = 0
    note: str = ""  # e.g. "on a CPU nothing uses NCCL"

    @property
    def verdict(self) -> str:
        if not self.points:
            return "not compared"
        return "effect" if self.differ else "no effect detected"


def _items(rec: JobRecord) -> dict[str, str]:
    return dict(item.lstrip("+~").partition("=")[::2] for item in override_items(rec.label))


def _cells(recs: list[JobRecord]) -> list[JobRecord]:
    """The finished cells compared: the speculative ones (else the baselines, a baseline-only sweep)."""
    done = [r for r in recs if r.status == "FINISHED" and "throughput_tok_s" in r.metrics]
    spec = [r for r in done if r.speculative]
    return spec or done


def axes(recs: list[JobRecord]) -> dict[str, list[str]]:
    """The override keys whose value differs among the cells -> their values, in order of appearance."""
    seen: dict[str, list[str]] = {}
    cells = [_items(r) for r in _cells(recs)]
    for items in cells:
        for k, v in items.items():
            if v not in seen.setdefault(k, []):
                seen[k].append(v)
    return {k: v for k, v in seen.items() if len(v) > 1 or any(k not in c for c in cells)}


def _interval(rec: JobRecord, name: str) -> tuple[float, float] | None:
    lo, hi = rec.metrics.get(f"{name}_ci95_lo"), rec.metrics.get(f"{name}_ci95_hi")
    return None if lo is None or hi is None or lo != lo or hi != hi else (lo, hi)


def effects(recs: list[JobRecord]) -> list[AxisEffect]:
    """One verdict per axis of the sweep (empty for a single cell)."""
    cells = _cells(recs)
    name = (
        "speedup_vs_baseline"
        if cells and all(_interval(r, "speedup_vs_baseline") for r in cells)
        else "throughput_tok_s"
    )
    fmt = ".3f" if name.startswith("speedup") else ".1f"
    all_axes = axes(recs)
    out = []
    for axis, values in all_axes.items():
        eff = AxisEffect(axis, values, name)
        whys = {nccl_inert(r) for r in cells} if axis == "nccl" else {None}
        if whys == {CPU_NO_NCCL}:
            eff.note = "on a CPU nothing uses NCCL"
        elif whys and None not in whys:
            eff.note = "; ".join(sorted(whys))  # e.g. "at tp 1 (the embedded engine makes no process group: ...)"
        points: dict[str, list[tuple[str, JobRecord]]] = {}
        for r in cells:
            items = _items(r)
            rest = ",".join(f"{k}={items[k]}" if k in items else f"{k} unset" for k in all_axes if k != axis)
            points.setdefault(rest, []).append((items.get(axis, "-"), r))
        for rest, arms in points.items():
            if len({v for v, _ in arms}) < 2:
                continue
            eff.points += 1
            found = False
            for i, (va, a) in enumerate(arms):
                for vb, b in arms[i + 1 :]:
                    ia, ib = _interval(a, name), _interval(b, name)
                    if va == vb or ia is None or ib is None or not (ia[1] < ib[0] or ib[1] < ia[0]):
                        continue
                    found = True
                    eff.differ.append(
                        f"at {rest or 'the one point'}: {axis}={va} [{ia[0]:{fmt}}, {ia[1]:{fmt}}] vs "
                        f"{axis}={vb} [{ib[0]:{fmt}}, {ib[1]:{fmt}}]"
                    )
            eff.differ_points += found
        out.append(eff)
    return out


def describe(effs: list[AxisEffect]) -> list[str]:
    """The summary's lines: one per axis, what it changed."""
    if not effs:
        return []
    lines = [f"what each axis changed (95% intervals of {effs[0].score_name}, cells matched on every other axis):"]
    for e in effs:
        note = f"; {e.note}" if e.note else ""
        if e.verdict == "not compared":
            lines.append(f"  {e.axis}: not compared (no two cells differ in {e.axis} alone){note}")
        elif e.verdict == "no effect detected":
            lines.append(
                f"  {e.axis}: no effect detected here (A/A): the intervals of {', '.join(e.values)} overlap at "
                f"every matched point ({e.points} of {e.points}){note}"
            )
        else:
            shown = "; ".join(e.differ[:3]) + (f"; ... ({len(e.differ)} pairs)" if len(e.differ) > 3 else "")
            lines.append(
                f"  {e.axis}: an effect at {e.differ_points} of {e.points} matched point(s) (disjoint intervals): "
                f"{shown}{note}"
            )
    return lines
