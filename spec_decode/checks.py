"""Self-consistency checks on a job's numbers: do they agree with each other?

Pure functions of the job's metrics, runs and phase profile (``results.finish`` calls them before the
one write of results.json). Each check is a ``Check``; a failed one is a visible warning in the
console, results.json, MLflow tags and reports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

CONSISTENCY_TOL = 0.03  # tok/s vs accept_len / cycle time (the source story missed by ~8%)
ENGINE_CLIENT_TOL = 0.05  # client wall time vs server e2e latency
COLLAPSE_ACCEPT_LEN = 1.05


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not applicable
    value: Any
    expected: str
    message: str

    def as_dict(self) -> dict:
        return asdict(self)


def _check(name: str, ok: bool | None, value, expected, message: str) -> Check:
    return Check(name, ok, value, expected, message)


def run_checks(metrics: dict[str, float], runs: list[dict], profile: dict | None,
               speculative: bool) -> list[Check]:
    """``runs``: the timed runs as dicts (``wall_s``, ``e2e_latency_s``); ``profile``: the phase
    summary (``non_cycle_ms_per_request``) or None. Reads only; the cost-model figures
    (``predicted_speedup`` ...) come from ``metrics``."""
    m = metrics
    out: list[Check] = []
    tput = m.get("throughput_tok_s")
    # 1. tok/s == accept_len / cycle time (both over the same timed runs).
    if tput and m.get("accept_len") and m.get("cycle_ms"):
        predicted = m["accept_len"] / (m["cycle_ms"] / 1e3)
        rel = tput / predicted - 1
        msg = (f"measured {tput:.1f} tok/s vs accept_len/cycle = {m['accept_len']:.3f} / "
               f"{m['cycle_ms']:.3f} ms = {predicted:.1f} tok/s ({100 * rel:+.1f}%)")
        outside = (profile or {}).get("non_cycle_ms_per_request")
        if outside is not None and runs:
            wall = 1e3 * sum(r["wall_s"] for r in runs) / len(runs)
            msg += (f"; {outside:.1f} ms of each {wall:.0f} ms request is outside the cycles "
                    f"(prefill, HTTP): {100 * outside / wall:.1f}% of the wall time")
        out.append(_check("throughput_vs_accept_over_cycle", abs(rel) <= CONSISTENCY_TOL, round(rel, 4),
                          f"|rel| <= {CONSISTENCY_TOL}", msg))
    # 2. The phases fit in the cycle.
    if m.get("cycle_ms"):
        parts = m["draft_ms"] + m["verify_ms"] + m["extend_ms"]
        out.append(_check(
            "phases_within_cycle", parts <= m["cycle_ms"] * 1.01, round(parts / m["cycle_ms"], 4), "<= 1.01",
            f"draft + verify + re-extend = {parts:.3f} ms of a {m['cycle_ms']:.3f} ms cycle "
            f"(other {m['other_pct']:.1f}%)",
        ))
    # 3. Client-side vs engine-side time (HTTP and queueing overhead).
    lat = [(r["wall_s"], r["e2e_latency_s"]) for r in runs if r.get("e2e_latency_s")]
    if lat:
        rel = sum(w for w, _ in lat) / sum(e for _, e in lat) - 1
        out.append(_check(
            "client_vs_engine_time", -0.01 <= rel <= ENGINE_CLIENT_TOL, round(rel, 4),
            f"0 <= rel <= {ENGINE_CLIENT_TOL}",
            f"client wall time is {100 * rel:+.1f}% of the engine's e2e latency",
        ))
    # 4. Speculation is working at all.
    if speculative and runs:
        al = m.get("accept_len")
        out.append(_check(
            "acceptance_not_collapsed", al is not None and al > COLLAPSE_ACCEPT_LEN, al,
            f"> {COLLAPSE_ACCEPT_LEN}",
            "accept length missing" if al is None else f"accept length {al:.2f} tokens per verify",
        ))
    # 5. The cost model (accept_len x T_decode / T_cycle, cost_model_metrics below) vs the
    #    measured speedup.
    if m.get("predicted_speedup") and m.get("speedup_vs_baseline"):
        predicted = m["predicted_speedup"]
        rel = m["speedup_vs_baseline"] / predicted - 1
        out.append(_check(
            "speedup_vs_cost_model", abs(rel) <= 2 * CONSISTENCY_TOL, round(rel, 4),
            f"|rel| <= {2 * CONSISTENCY_TOL}",
            f"verify/decode ratio {m['verify_decode_ratio']:.2f}, break-even accept length "
            f"{m['break_even_accept_len']:.2f}; accept_len x T_decode / T_cycle predicts {predicted:.3f}x, "
            f"measured {m['speedup_vs_baseline']:.3f}x",
        ))
    return out


def cost_model_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Verify/decode ratio, break-even accept length and the predicted speedup S = L x T_dec / T_cycle
    (T_dec from the baseline's throughput); empty without a baseline or a phase profile."""
    m = metrics
    base = m.get("baseline_throughput_tok_s")
    if not (base and m.get("cycle_ms") and m.get("accept_len")):
        return {}
    t_dec = 1e3 / base
    break_even = m["cycle_ms"] / t_dec
    return {"verify_decode_ratio": m["verify_ms"] / t_dec, "break_even_accept_len": break_even,
            "predicted_speedup": m["accept_len"] / break_even}
