"""The A/A control of a sweep (issue 25): cells known to measure the same thing must agree.

A sweep's intervals are only as honest as the noise model behind them. The control tests that model on
the sweep's own data: two cells whose difference is known to be nothing are measured like any other
pair of cells; if their 95% speedup intervals are disjoint, the machine's noise exceeds what the
intervals state, and no choice between cells can rest on them (``recommend`` refuses to choose).

Which cells are known-identical:
- cells that differ only in the NCCL profile where no NCCL runs: on a CPU (``hardware.device=cpu``), or
  wherever the job's engine said so (``record.engine.nccl_inert``: the embedded engine at tp 1 makes no
  process group). There ``nccl=tuned`` and ``nccl=default`` are the same experiment (embedded_steps_nccl
  has 4 such pairs, the one-GPU block designs 2, at no extra cost);
- anywhere, cells that differ only in ``benchmark.replicate`` (a label with no effect: sweep
  ``benchmark.replicate=0,1`` on one cell, e.g. the default spec cell, to buy a control where no axis
  is inert; its cost is one more cell).

Agreement = the two 95% speedup intervals overlap (for intervals of equal width that is a test at
about the 0.6% level: a disagreement is strong evidence, not a coin flip). Cells without a speedup
interval are compared on their tok/s intervals.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the record type, for annotations only: analysis sits below record
    from spec_decode.record.results import JobRecord


REPLICATE_KEY = "replicate"  # benchmark.replicate
CPU_NO_NCCL = "on a CPU (no NCCL runs)"


@dataclass
class PairVerdict:
    a: str  # the cells' labels
    b: str
    why_identical: str
    metric: str  # "speedup_vs_baseline" | "throughput_tok_s"
    a_ci: tuple[float, float]
    b_ci: tuple[float, float]
    agree: bool


@dataclass
class Control:
    status: str  # "ok" | "disagree" | "none" (no known-identical pair in the sweep)
    message: str
    pairs: list[PairVerdict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _identity(rec: JobRecord, inert: tuple[str, ...]) -> str:
    """The record's config without the keys that do not change what is measured (and its name)."""
    conf = {k: v for k, v in rec.config.items() if k not in ("name", "tracking", *inert)}
    bench = dict(conf.get("benchmark") or {})
    bench.pop(REPLICATE_KEY, None)
    conf["benchmark"] = bench
    return json.dumps(conf, sort_keys=True, default=str)


def is_cpu(rec: JobRecord) -> bool:
    hw = rec.config.get("hardware") or {}
    return hw.get("device") == "cpu" or (hw.get("device") is None and hw.get("name") == "cpu")


def nccl_inert(rec: JobRecord) -> str | None:
    """Why no NCCL ran in this job: the engine's recorded answer, or a CPU (records from before the
    engine answered); None when it may have run."""
    return rec.engine.nccl_inert or (CPU_NO_NCCL if is_cpu(rec) else None)


# An interval of fewer runs says nothing about the spread (recommend.MIN_RUNS is this): such a pair is
# not judged, or a 2-run interval that happens to be narrow raises an alarm from one data point.
MIN_RUNS = 3


def _n_runs(rec: JobRecord) -> int:
    return int((rec.throughput_tok_s and rec.throughput_tok_s.n) or len(rec.runs))


def _interval(rec: JobRecord, metric: str) -> tuple[float, float] | None:
    lo, hi = rec.metrics.get(f"{metric}_ci95_lo"), rec.metrics.get(f"{metric}_ci95_hi")
    if lo is None or hi is None or lo != lo or hi != hi:  # NaN: no interval
        return None
    return lo, hi


def pairs(recs: list[JobRecord]) -> list[tuple[JobRecord, JobRecord, str]]:
    """Known-identical pairs among the finished jobs: (a, b, why)."""
    done = [r for r in recs if r.status == "FINISHED" and "throughput_tok_s" in r.metrics]
    out = []
    for i, a in enumerate(done):
        for b in done[i + 1 :]:
            if a.role != b.role:
                continue
            rep_a = (a.config.get("benchmark") or {}).get(REPLICATE_KEY)
            rep_b = (b.config.get("benchmark") or {}).get(REPLICATE_KEY)
            if rep_a != rep_b and _identity(a, ()) == _identity(b, ()):
                out.append((a, b, f"replicates (benchmark.replicate={rep_a} vs {rep_b})"))
            elif (
                nccl_inert(a)
                and nccl_inert(b)
                and a.choice("nccl") != b.choice("nccl")
                and rep_a == rep_b
                and _identity(a, ("nccl",)) == _identity(b, ("nccl",))
            ):
                out.append((a, b, f"nccl={a.choice('nccl')} vs nccl={b.choice('nccl')} {nccl_inert(a)}"))
    return out


def check(recs: list[JobRecord]) -> Control:
    """The sweep's A/A verdict over every known-identical pair of spec cells (baselines when no spec)."""
    found = pairs(recs)
    spec = [p for p in found if p[0].speculative]
    found = spec or found
    verdicts, few = [], []
    for a, b, why in found:
        if min(_n_runs(a), _n_runs(b)) < MIN_RUNS:
            few.append(min(_n_runs(a), _n_runs(b)))
            continue
        metric = (
            "speedup_vs_baseline"
            if _interval(a, "speedup_vs_baseline") and _interval(b, "speedup_vs_baseline")
            else "throughput_tok_s"
        )
        ia, ib = _interval(a, metric), _interval(b, metric)
        if ia is None or ib is None:
            continue
        verdicts.append(PairVerdict(a.label, b.label, why, metric, ia, ib, max(ia[0], ib[0]) <= min(ia[1], ib[1])))
    if not verdicts and few:
        return Control(
            "none",
            f"no A/A verdict: {len(few)} known-identical pair(s), but with {min(few)} run(s) a job (< {MIN_RUNS}) "
            "their intervals say nothing about the spread (set benchmark.runs >= 3)",
        )
    if not verdicts:
        return Control(
            "none",
            "no A/A control in this sweep (no known-identical pair of cells: on a GPU "
            "add one with benchmark.replicate=0,1 on one cell)",
        )
    bad = [v for v in verdicts if not v.agree]
    if not bad:
        return Control(
            "ok",
            f"A/A control agrees: {len(verdicts)} known-identical pair(s), every pair's 95% intervals overlap",
            verdicts,
        )
    worst = bad[0]
    return Control(
        "disagree",
        (
            f"A/A control DISAGREES: {len(bad)} of {len(verdicts)} known-identical pair(s) have disjoint 95% "
            f"intervals ({worst.a} [{worst.a_ci[0]:.3f}, {worst.a_ci[1]:.3f}] vs {worst.b} "
            f"[{worst.b_ci[0]:.3f}, {worst.b_ci[1]:.3f}], {worst.metric}; {worst.why_identical}): this machine's "
            f"noise exceeds the stated intervals, so no cell can be chosen from them"
        ),
        verdicts,
    )


def tag(c: Control) -> str:
    """The sweep's parent-run tag ``aa_control``: ``ok`` / ``disagree`` / ``none`` and the reason."""
    return f"{c.status}: {c.message}"[:5000]
