"""Cost model: from a steps sweep, predict throughput for step counts not measured.

- Acceptance, measured: where the records carry the per-position acceptance rates (``accept_rate_pos<i>``,
  spec_decode.analysis.acceptance: rate_i = P(accepted >= i | accepted >= i-1)), the rates measured at the largest
  step count of the sweep predict L(k) = 1 + sum_{i<=k} prod_{j<=i} rate_j; beyond the measured
  positions the fitted rates below continue the chain (each prediction says which: ``accept_len_from``).
- Acceptance, fitted (no measured rates, and beyond them): the chain model (Leviathan et al. 2023): with
  per-position acceptance alpha, a cycle with k draft tokens commits L(k) = (1 - alpha^(k+1)) / (1 - alpha)
  tokens (incl. the bonus). With 3 or more measured step counts a decay is fitted too (position j accepted
  with alpha * decay^(j-1)): a drafter trained for few steps (EAGLE-3's training-time test unrolls ~3)
  accepts less at deeper positions, and the i.i.d. model then over-predicts long chains. Least squares on
  the measured accept lengths.
- Time per cycle: each phase is fitted as fixed + per-token part over the measured points --
  verify(k) = a + b (k+1) (the source found verify barely changes from 6 to 3 draft tokens, i.e. b is
  small), draft(k) = c + d k, re-extend(k) = e + f k; other = its mean. The fit is constrained to be
  physical (issue 25): a, b, c, d, e, f >= 0 (bounded least squares, scipy.optimize.lsq_linear); a noisy
  sweep otherwise fits a negative cost per token (``verify = 4.44 + -0.401 x tokens``) that makes long
  chains look free. Each phase states its fit quality: R^2 and the rms residual (ms).
- Best: ``best_steps`` is the best predicted step count *within the measured range* (min..max measured
  steps). A higher prediction outside it is kept apart (``best_outside``) and always printed labelled as
  an extrapolation; every prediction row says whether it is one (``extrapolated``).
- Predicted tok/s(k) = L(k) / cycle(k), scaled by the median measured/predicted ratio of the measured
  points (the measured side also pays prefill and HTTP, which the per-cycle model does not see).
- Interval: +- t(0.975, n-1) x the std of the measured points' relative residuals (n = points), a
  plain measure of how well the model reproduced what was measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from spec_decode.analysis.acceptance import rates_from_metrics
from spec_decode.analysis.stats import t_ppf
from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record.results import performance_only

with frozen_imports():  # scipy.optimize: ~300 modules (spec_decode/core/gc_imports.py)
    from scipy import optimize

if TYPE_CHECKING:
    from spec_decode.record.results import JobRecord


@dataclass
class Point:
    steps: int
    accept_len: float
    draft_ms: float
    verify_ms: float
    extend_ms: float
    other_ms: float
    throughput_tok_s: float | None = None
    accept_rates: list[float] | None = None  # measured rate at draft positions 1..steps, if known


@dataclass
class Fit:
    alpha: float
    decay: float
    verify: tuple[float, float]  # a, b per verified token
    draft: tuple[float, float]
    extend: tuple[float, float]
    other_ms: float
    scale: float
    rel_sd: float
    n: int
    predictions: list[dict] = field(default_factory=list)
    fit_quality: dict = field(default_factory=dict)  # phase -> {"r2", "rms_ms"} of its constrained line
    measured_steps: tuple[int, int] | None = None  # (min, max) measured step count
    best_outside: dict | None = None  # the best prediction when it lies outside the measured range
    best_steps: int | None = None  # the best predicted step count within the measured range
    best_tok_s: tuple[float, float, float] | None = None  # predicted, lo, hi
    accept_rates: list[float] | None = None  # the measured per-position rates the model uses
    rates_steps: int | None = None  # the step count they were measured at

    def as_dict(self) -> dict:
        return asdict(self)


def chain_accept_len(alpha: float, k: int, decay: float = 1.0) -> float:
    """Tokens per cycle of a k-draft chain whose position j is accepted with alpha * decay^(j-1)
    (given all before it were); decay = 1 is the i.i.d. chain (1 - alpha^(k+1)) / (1 - alpha)."""
    total, p = 1.0, 1.0
    for j in range(k):
        p *= alpha * decay**j
        total += p
    return total


def fit_acceptance(points: list[Point]) -> tuple[float, float]:
    """(alpha, decay) by least squares on the measured accept lengths; decay is fitted only with 3 or
    more step counts (a drafter trained for few steps accepts less at deeper positions)."""

    def loss(x) -> float:
        return sum((chain_accept_len(x[0], p.steps, x[1]) - p.accept_len) ** 2 for p in points)

    def loss_iid(a: float) -> float:
        return loss((a, 1.0))

    a = float(optimize.minimize_scalar(loss_iid, bounds=(1e-4, 0.9999), method="bounded", options={"xatol": 1e-12}).x)
    if len({p.steps for p in points}) < 3:
        return a, 1.0
    best = min(
        (
            optimize.minimize(
                loss,
                x0=(a0, d0),
                bounds=[(1e-4, 0.9999), (0.3, 1.0)],
                method="L-BFGS-B",
                options={"ftol": 1e-15, "gtol": 1e-12},
            )
            for a0, d0 in ((a, 1.0), (min(0.99, a + 0.05), 0.9), (0.9, 0.8))
        ),
        key=lambda r: r.fun,
    )
    if best.fun < loss_iid(a) - 1e-12:
        return float(best.x[0]), float(best.x[1])
    return a, 1.0


def nonneg_line(xs: list[float], ys: list[float]) -> tuple[float, float, dict]:
    """y = a + b x with a, b >= 0 (bounded least squares), and its fit quality: R^2 (None when y does
    not vary) and the rms residual. One distinct x: the mean, slope 0."""
    if len(set(xs)) < 2:
        a, b = max(0.0, statistics.fmean(ys)), 0.0
    else:
        sol = optimize.lsq_linear(
            np.column_stack([np.ones(len(xs)), xs]), np.asarray(ys, float), bounds=(0.0, np.inf), method="bvls"
        )
        a, b = float(sol.x[0]), float(sol.x[1])
    res = [y - (a + b * x) for x, y in zip(xs, ys)]
    ss_res = sum(r * r for r in res)
    mean = statistics.fmean(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    return a, b, {"r2": 1 - ss_res / ss_tot if ss_tot > 0 else None, "rms_ms": math.sqrt(ss_res / len(ys))}


def cycle_ms(fit: Fit, k: int) -> float:
    return (
        fit.verify[0]
        + fit.verify[1] * (k + 1)
        + fit.draft[0]
        + fit.draft[1] * k
        + fit.extend[0]
        + fit.extend[1] * k
        + fit.other_ms
    )


def fitted_rate(fit: Fit, position: int) -> float:
    """The fitted acceptance at draft position ``position`` (1-based): alpha * decay^(position-1)."""
    return fit.alpha * fit.decay ** (position - 1)


def predicted_accept_len(fit: Fit, k: int) -> tuple[float, str]:
    """(L(k), where it came from): the measured per-position rates where the fit has them (the fitted
    rates continue beyond the last measured position), else the fitted chain."""
    if not fit.accept_rates:
        return chain_accept_len(fit.alpha, k, fit.decay), "fit"
    m = len(fit.accept_rates)
    total, p = 1.0, 1.0
    for j in range(1, k + 1):
        p *= fit.accept_rates[j - 1] if j <= m else fitted_rate(fit, j)
        total += p
    if k <= m:
        return total, f"measured rates (steps={fit.rates_steps})"
    return total, f"measured rates 1..{m} (steps={fit.rates_steps}) + fit beyond"


def raw_tok_s(fit: Fit, k: int) -> float:
    return predicted_accept_len(fit, k)[0] / (cycle_ms(fit, k) / 1e3)


def measured_rates(points: list[Point]) -> tuple[list[float] | None, int | None]:
    """The per-position rates measured at the largest step count that has them (only the deepest chain
    measures the deep positions; its shallow ones are the same drafter's); (None, None) without any."""
    have = [p for p in points if p.accept_rates]
    if not have:
        return None, None
    p = max(have, key=lambda p: p.steps)
    return list(p.accept_rates), p.steps


def fit(points: list[Point], max_steps: int = 8) -> Fit:
    if len(points) < 2:
        raise ValueError("the cost model needs at least 2 measured step counts")
    ks = [p.steps for p in points]
    alpha, decay = fit_acceptance(points)
    lines = {
        "verify": nonneg_line([k + 1 for k in ks], [p.verify_ms for p in points]),
        "draft": nonneg_line(ks, [p.draft_ms for p in points]),
        "extend": nonneg_line(ks, [p.extend_ms for p in points]),
    }
    f = Fit(
        alpha=alpha,
        decay=decay,
        verify=lines["verify"][:2],
        draft=lines["draft"][:2],
        extend=lines["extend"][:2],
        other_ms=max(0.0, statistics.fmean(p.other_ms for p in points)),
        scale=1.0,
        rel_sd=0.0,
        n=len(points),
        fit_quality={name: q for name, (_, _, q) in lines.items()},
        measured_steps=(min(ks), max(ks)),
    )
    f.accept_rates, f.rates_steps = measured_rates(points)
    measured = [(p, p.throughput_tok_s) for p in points if p.throughput_tok_s]
    if measured:
        f.scale = statistics.median(m / raw_tok_s(f, p.steps) for p, m in measured)
        rel = [f.scale * raw_tok_s(f, p.steps) / m - 1 for p, m in measured]
        f.rel_sd = statistics.stdev(rel) if len(rel) > 1 else 0.0
    t = t_ppf(0.975, max(f.n - 1, 1))
    by_k = {p.steps: p for p in points}
    for k in range(1, max(max_steps, max(ks)) + 1):
        pred = f.scale * raw_tok_s(f, k)
        half = t * f.rel_sd * pred
        accept_len, source = predicted_accept_len(f, k)
        row = {
            "steps": k,
            "predicted_tok_s": pred,
            "lo": max(0.0, pred - half),  # tok/s cannot go below 0 (2 step counts: t with 1 df)
            "hi": pred + half,
            "predicted_accept_len": accept_len,
            "accept_len_from": source,
            "predicted_cycle_ms": cycle_ms(f, k),
            "measured_tok_s": by_k[k].throughput_tok_s if k in by_k else None,
            "extrapolated": not min(ks) <= k <= max(ks),
        }
        f.predictions.append(row)
    inside = max((r for r in f.predictions if not r["extrapolated"]), key=lambda r: r["predicted_tok_s"])
    f.best_steps = inside["steps"]
    f.best_tok_s = (inside["predicted_tok_s"], inside["lo"], inside["hi"])
    overall = max(f.predictions, key=lambda r: r["predicted_tok_s"])
    if overall["extrapolated"] and overall["predicted_tok_s"] > inside["predicted_tok_s"]:
        f.best_outside = {
            "steps": overall["steps"],
            "tok_s": (overall["predicted_tok_s"], overall["lo"], overall["hi"]),
        }
    return f


def extrapolation_note(f: Fit) -> str | None:
    """The label a best outside the measured steps always carries (console, report, plot legend)."""
    if f.best_outside is None:
        return None
    lo, hi = f.measured_steps
    return (
        f"EXTRAPOLATION: steps={f.best_outside['steps']} predicted {f.best_outside['tok_s'][0]:.1f} tok/s, "
        f"outside the measured steps {lo}..{hi}; not measured, not a recommendation"
    )


POINT_METRICS = {"accept_len", "cycle_ms", "draft_ms", "verify_ms", "extend_ms", "other_ms", "throughput_tok_s"}


def points_from_records(recs: list[JobRecord], nccl: str | None = None) -> list[Point]:
    """One point per step count from finished speculative records with a phase profile (averaged when
    a step count appears more than once, e.g. under two NCCL profiles unless ``nccl`` selects one);
    performance-only records (forced acceptance) are left out."""
    groups: dict[int, list[dict]] = {}
    for r in recs:
        m = r.metrics
        if r.status != "FINISHED" or not r.speculative or not POINT_METRICS <= m.keys() or performance_only(r):
            continue  # forced acceptance (performance-only) is not the drafter's acceptance
        if nccl is not None and r.choice("nccl") != nccl:
            continue
        groups.setdefault(r.steps, []).append(m)
    out = []
    for k, ms in sorted(groups.items()):

        def avg(key: str, ms: list[dict] = ms) -> float:
            return statistics.fmean(m[key] for m in ms)

        # the measured per-position rates, averaged over the jobs that measured every position
        rates = [rates_from_metrics(m) for m in ms]
        full = [r for r in rates if len(r) >= k]
        mean_rates = [statistics.fmean(r[i] for r in full) for i in range(k)] if full else None
        out.append(
            Point(
                k,
                avg("accept_len"),
                avg("draft_ms"),
                avg("verify_ms"),
                avg("extend_ms"),
                avg("other_ms"),
                avg("throughput_tok_s"),
                mean_rates,
            )
        )
    return out


def rates_vs_fit(f: Fit) -> list[dict]:
    """Per draft position: the measured rate the model uses vs the fitted alpha * decay^(i-1)."""
    return [
        {"position": i, "measured": r, "fitted": fitted_rate(f, i), "diff": fitted_rate(f, i) - r}
        for i, r in enumerate(f.accept_rates or [], start=1)
    ]


def describe(f: Fit) -> str:
    acc = f"fitted acceptance {f.alpha:.3f} x {f.decay:.3f}^(position-1)"
    if f.accept_rates:
        acc = (
            f"acceptance: per-position rates measured at steps={f.rates_steps} "
            f"({' '.join(f'{r:.3f}' for r in f.accept_rates)}), beyond them the {acc}"
        )
    lines = [
        f"cost model (n={f.n} step counts): {acc}; verify = "
        f"{f.verify[0]:.2f} + {f.verify[1]:.3f} x tokens ms; draft = {f.draft[0]:.2f} + {f.draft[1]:.3f} x k ms; "
        f"re-extend = {f.extend[0]:.2f} + {f.extend[1]:.3f} x k ms; other {f.other_ms:.2f} ms; "
        f"scale {f.scale:.3f}; residual sd {100 * f.rel_sd:.1f}%",
        "  constrained fit (costs >= 0): "
        + "; ".join(
            f"{name} R^2 {'-' if q['r2'] is None else format(q['r2'], '.2f')}, rms {q['rms_ms']:.2f} ms"
            for name, q in f.fit_quality.items()
        ),
        "steps  predicted tok/s [95% interval]   measured   accept len (pred)  cycle ms (pred)"
        + ("  accept len from" if f.accept_rates else ""),
    ]
    for r in f.predictions:
        meas = f"{r['measured_tok_s']:.1f}" if r["measured_tok_s"] else "-"
        lines.append(
            f"{r['steps']:>5}  {r['predicted_tok_s']:8.1f} [{r['lo']:.1f}, {r['hi']:.1f}]"
            f"   {meas:>8}   {r['predicted_accept_len']:8.2f}          {r['predicted_cycle_ms']:7.2f}"
            + (f"  {r['accept_len_from']}" if f.accept_rates else "")
            + ("  (extrapolated)" if r.get("extrapolated") else "")
        )
    lo, hi = f.best_tok_s[1], f.best_tok_s[2]
    lines.append(
        f"predicted best: steps={f.best_steps} at {f.best_tok_s[0]:.1f} tok/s [{lo:.1f}, {hi:.1f}] "
        f"(within the measured steps {f.measured_steps[0]}..{f.measured_steps[1]})"
    )
    if (note := extrapolation_note(f)) is not None:
        lines.append(note)
    if not math.isfinite(f.rel_sd) or f.n < 3:
        lines.append("(fewer than 3 measured step counts: the interval is not informative)")
    return "\n".join(lines)
