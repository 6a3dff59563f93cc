"""Per-cycle phase profile lines (DESIGN 3.4), kept inside the timed runs' windows and aggregated.

Each line: ``{"t", "draft_ms", "verify_ms", "extend_ms", "cycle_ms", "accepted"}``; other = cycle -
(draft + verify + extend).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

PHASES = ("draft", "verify", "extend", "other")


def read_profile(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed server
        if isinstance(rec, dict) and {"t", "cycle_ms"} <= rec.keys():
            out.append(rec)
    return out


def in_windows(cycles: list[dict], windows: list[tuple[float, float]]) -> list[list[dict]]:
    """The cycles whose end time falls in each (start, end) wall-clock window."""
    return [[c for c in cycles if lo <= c["t"] <= hi] for lo, hi in windows]


def phase_summary(cycles: list[dict]) -> dict | None:
    """Mean ms per cycle for each phase, % of the cycle, accept length; None without cycles."""
    if not cycles:
        return None
    n = len(cycles)
    mean = {p: sum(c.get(f"{p}_ms", 0.0) for c in cycles) / n for p in ("draft", "verify", "extend")}
    cycle = sum(c["cycle_ms"] for c in cycles) / n
    mean["other"] = cycle - mean["draft"] - mean["verify"] - mean["extend"]
    out = {"cycles": n, "cycle_ms": cycle, "cycle_ms_median": statistics.median(c["cycle_ms"] for c in cycles)}
    for p in PHASES:
        out[f"{p}_ms"] = mean[p]
        out[f"{p}_pct"] = 100.0 * mean[p] / cycle if cycle > 0 else 0.0
    accepted = sum(c.get("accepted", 0) for c in cycles)
    out["accept_len"] = accepted / n
    out["tok_s_from_profile"] = accepted / (sum(c["cycle_ms"] for c in cycles) / 1e3)
    return out
