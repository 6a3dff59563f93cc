"""Per-cycle phase profile lines (DESIGN 3.4), one file per rank, kept inside the profiled runs'
windows and aggregated.

Each line: ``{"t", "t0", "rank", "tp", "dp", "attn_dp", "draft_ms", "verify_ms", "extend_ms",
"cycle_ms", "accepted"[, "rids", "accept_lens"]}`` (accepted: the batch's committed tokens;
accept_lens: per request, in the order of rids); other = cycle - (draft + verify + extend). The rank at (dp d, tp
t) writes ``<stem>.dp<d>.tp<t><suffix>`` beside the path given in ``SPEC_DECODE_PROFILE``
(``profile.jsonl`` -> ``profile.dp0.tp0.jsonl``; older profiles ``profile.rank<t>.jsonl`` read as dp 0).
Every TP rank of a replica runs every cycle of that replica, so the job's phases are the logging rank's
(tp 0, as SGLang logs from attention-TP rank 0) -- of every replica, whose cycles are different
requests' -- and the other TP ranks are compared with their replica's tp 0, never pooled.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

PHASES = ("draft", "verify", "extend", "other")
# Ranks run the same cycles; their phase means may differ by measurement noise and by where each
# rank waits in the all-reduces, but their cycle times must agree closely.
AGREEMENT_TOLERANCE_PCT = 10.0


def rank_path(path: str | Path, rank: int, dp: int = 0) -> str:
    """The file of TP rank ``rank`` of replica ``dp``."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.dp{dp}.tp{rank}{p.suffix}"))


def rank_files(path: str | Path) -> dict[tuple[int, int], Path]:
    """{(dp, tp): file} for the per-rank files that exist beside ``path`` (old ``.rank<t>`` names as
    dp 0; a new name wins over an old one for the same rank)."""
    p = Path(path)
    stem, suffix = re.escape(p.stem), re.escape(p.suffix)
    new = re.compile(stem + r"\.dp(\d+)\.tp(\d+)" + suffix + "$")
    old = re.compile(stem + r"\.rank(\d+)" + suffix + "$")
    out: dict[tuple[int, int], Path] = {}
    for f in p.parent.glob(f"{p.stem}.*{p.suffix}"):
        if m := new.match(f.name):
            out[(int(m.group(1)), int(m.group(2)))] = f
        elif (m := old.match(f.name)) and (0, int(m.group(1))) not in out:
            out[(0, int(m.group(1)))] = f
    return dict(sorted(out.items()))


def read_profile(path: Path) -> list[dict]:
    """The cycles of one rank's file. A line written twice is one cycle: a SIGTERM drain that interrupts
    another drain of the same thread (the rank's atexit drain when its front died) rewrites the lines
    the first had written but not yet dequeued -- never loses them; no two cycles share their stamps."""
    if not path.exists():
        return []
    out = []
    seen: set[str] = set()
    for line in path.read_text().splitlines():
        if line in seen:
            continue
        seen.add(line)
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed server
        if isinstance(rec, dict) and {"t", "cycle_ms"} <= rec.keys():
            out.append(rec)
    return out


def read_replicas(path: str | Path) -> dict[tuple[int, int], list[dict]]:
    """{(dp, tp): cycles} of every rank file beside ``path``."""
    return {k: read_profile(f) for k, f in rank_files(path).items()}


def read_ranks(path: str | Path, dp: int = 0) -> dict[int, list[dict]]:
    """{tp: cycles} of one replica (dp 0 by default)."""
    return {t: read_profile(f) for (d, t), f in rank_files(path).items() if d == dp}


def in_windows(cycles: list[dict], windows: list[tuple[float, float]]) -> list[list[dict]]:
    """The cycles that began in each (start, end) wall-clock window: entry stamp ``t0`` (older lines:
    their end ``t``). By entry, not end: a TP rank other than the answering one may end the request's
    last cycle after the client has its response (rank 0 answered while it was still in its re-extend,
    which has no collective) -- selected by end, that cycle fell out and the ranks seemed to disagree."""
    return [[c for c in cycles if lo <= c.get("t0", c["t"]) <= hi] for lo, hi in windows]


def run_timing(cycles: list[dict], start_wall: float, end_wall: float, wall_s: float) -> dict | None:
    """Where one timed request's wall time went, from its cycles (rank 0, inside its window).

    Two clocks: each cycle's duration (``cycle_ms``) and the wall-clock time its end was stamped
    (``t``). Between the first and the last cycle end, the decode span holds cycles 2..N and the gaps
    between cycles (loop and scheduler time that no cycle covers):

    - ``interval_over_cycle``: the median over cycles 2..N of a cycle's wall-clock time against its own
      duration: (t_i - t0_i) / cycle_ms_i where the lines carry ``t0`` (the wall clock when the cycle
      was entered: the loop time between cycles stays out), else (t_i - t_(i-1)) / cycle_ms_i (older
      profiles: 1 plus the typical gap). Whatever an occasional long gap adds does not move the median;
      below 1 the durations are longer than the wall clock allows;
    - ``span_tok_s``: tokens committed by cycles 2..N / (t_N - t_1) -- tok/s inside the decode, on the
      wall clock, gaps included; ``cycle_tok_s``: the same tokens / the same cycles' summed ``cycle_ms``
      -- what accept_len / cycle predicts.
    - outside the cycles: ``head_ms`` (request start -> first cycle's start: HTTP in, tokenize,
      prefill), ``gap_ms``, ``tail_ms`` (last cycle end -> response received);
      ``non_cycle_ms`` = wall - sum(cycle_ms) = head + gaps + tail.
    None without cycles."""
    if not cycles:
        return None
    first, last = cycles[0], cycles[-1]
    later = cycles[1:]
    span_ms = (last["t"] - first["t"]) * 1e3
    later_cycle_ms = sum(c["cycle_ms"] for c in later)
    later_tokens = sum(c.get("accepted") or 0 for c in later)
    cycle_ms_sum = sum(c["cycle_ms"] for c in cycles)
    if all("t0" in c for c in later):
        ratios = [(b["t"] - b["t0"]) * 1e3 / b["cycle_ms"] for b in later if b["cycle_ms"] > 0]
    else:
        ratios = [(b["t"] - a["t"]) * 1e3 / b["cycle_ms"] for a, b in zip(cycles, later) if b["cycle_ms"] > 0]
    return {
        "interval_over_cycle": statistics.median(ratios) if ratios else None,
        "cycles": len(cycles),
        "accepted": sum(c.get("accepted") or 0 for c in cycles),
        "cycle_ms_sum": cycle_ms_sum,
        "span_ms": span_ms,
        "span_tok_s": later_tokens / (span_ms / 1e3) if span_ms > 0 else None,
        "cycle_tok_s": later_tokens / (later_cycle_ms / 1e3) if later_cycle_ms > 0 else None,
        "head_ms": (first["t"] - start_wall) * 1e3 - first["cycle_ms"],
        "gap_ms": span_ms - later_cycle_ms,
        "tail_ms": (end_wall - last["t"]) * 1e3,
        "non_cycle_ms": wall_s * 1e3 - cycle_ms_sum,
        "wall_ms": wall_s * 1e3,
    }


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
    accepted = sum(c.get("accepted") or 0 for c in cycles)
    # per request and cycle: a batch of k requests commits k accept lengths in one cycle
    req_cycles = sum(len(c["accept_lens"]) if c.get("accept_lens") else 1 for c in cycles)
    # A request's view of a batch cycle (_for_request) carries the batch size it ran in.
    out["batch_size_mean"] = (
        sum(c.get("batch_size") or (len(c["accept_lens"]) if c.get("accept_lens") else 1) for c in cycles) / n
    )
    out["accept_len"] = accepted / req_cycles if req_cycles else 0.0
    out["tok_s_from_profile"] = accepted / (sum(c["cycle_ms"] for c in cycles) / 1e3)
    return out


def rank_agreement(per_rank: dict[int, dict], ref: int = 0, tolerance_pct: float = AGREEMENT_TOLERANCE_PCT) -> dict:
    """How the other ranks' summaries compare with the reference rank's: cycle counts must be equal
    (every rank runs every cycle) and mean cycle times within ``tolerance_pct``."""
    base = per_rank[ref]
    ranks = {}
    ok = True
    for r, s in per_rank.items():
        if r == ref:
            continue
        diff = 100.0 * (s["cycle_ms"] - base["cycle_ms"]) / base["cycle_ms"] if base["cycle_ms"] else 0.0
        same_count = s["cycles"] == base["cycles"]
        ranks[str(r)] = {
            "cycles": s["cycles"],
            "cycle_ms": s["cycle_ms"],
            "cycle_ms_diff_pct": diff,
            **{f"{p}_ms": s[f"{p}_ms"] for p in PHASES},
        }
        ok = ok and same_count and abs(diff) <= tolerance_pct
    return {"reference_rank": ref, "tolerance_pct": tolerance_pct, "ok": ok, "ranks": ranks}


def counted_in_windows(
    per_window: list[list[dict]], requests: list[tuple[str | None, int | None]]
) -> tuple[list[list[dict]], int]:
    """Each window's cycles that its request counted (``attribute``; ``requests[i]`` = (rid,
    spec_verify_ct) of window i's request): the in-flight extras dropped and numbered. Cycles
    without rids, or a request without a rid, are kept as they are."""
    out, extra = [], 0
    for w, (rid, verify) in zip(per_window, requests):
        if rid is None or verify is None or not any(c.get("rids") for c in w):
            out.append(w)
            continue
        mine = [c for c in w if not c.get("rids") or rid in c["rids"]]
        # Judged for this window's request alone: in a batch, a cycle that is this request's in-flight
        # extra may be counted by the others (their windows count it for them).
        a = attribute([_for_request(c, rid) for c in mine], {rid: verify})
        out.append(a["counted"])
        extra += a["extra_cycles"]
    return out, extra


def _for_request(cycle: dict, rid: str) -> dict:
    """One request's view of a cycle: in a batch (``rids`` with ``accept_lens``) its own committed tokens,
    and the batch size it ran in (``batch_size``); a cycle of one request, or without rids, as it is.
    A window's cycles are its request's views, so summing over windows counts each batch cycle once per
    request it served: cycles = the requests' spec_verify_ct, tokens = their committed tokens."""
    rids, lens = cycle.get("rids"), cycle.get("accept_lens")
    if not rids or rid not in rids:
        return cycle
    own = dict(cycle, rids=[rid], batch_size=len(rids))
    if lens and len(lens) == len(rids):
        own["accepted"] = lens[rids.index(rid)]
        own["accept_lens"] = [own["accepted"]]
    return own


def _counted(per_window: list[list[dict]], requests) -> list[list[dict]]:
    return per_window if requests is None else counted_in_windows(per_window, requests)[0]


def summarize_run_windows(
    path: str | Path,
    windows: list[tuple[float, float]],
    ref: int = 0,
    requests: list[tuple[str | None, int | None]] | None = None,
) -> tuple[dict | None, list[list[dict]]]:
    """The job's profile: the logging rank's (tp ``ref``) cycles in the windows -- of every replica,
    whose cycles are different requests' -- (summary + per-window cycles), and, with several ranks,
    each replica's other ranks' agreement with its own tp ``ref``. With ``requests`` ((rid,
    spec_verify_ct) per window) only the cycles their requests counted (``counted_in_windows``;
    ``extra_cycles`` says how many in-flight extras were set apart). (None, []) without that rank."""
    reps = read_replicas(path)
    dps = sorted({d for d, t in reps if t == ref})
    if not dps:
        return None, []
    cycles = sorted((c for d in dps for c in reps[(d, ref)]), key=lambda c: c["t"])
    per_window = in_windows(cycles, windows)
    extra = 0
    if requests is not None:
        per_window, extra = counted_in_windows(per_window, requests)
    summary = phase_summary([c for w in per_window for c in w])
    if summary is None:
        return None, per_window
    summary["extra_cycles"] = extra
    summary["ranks"] = len(reps)
    summary["replicas"] = len({d for d, _ in reps})
    summary["rank"] = ref
    if len(reps) > 1:
        agreement = {"reference_rank": ref, "tolerance_pct": AGREEMENT_TOLERANCE_PCT, "ok": True, "ranks": {}}
        missing = []
        for d in sorted({d for d, _ in reps}):
            mine = {
                t: s
                for (dd, t), cs in reps.items()
                if dd == d
                if (s := phase_summary([c for w in _counted(in_windows(cs, windows), requests) for c in w])) is not None
            }
            missing += [f"dp{d}.tp{t}" if len(dps) > 1 else t for (dd, t) in reps if dd == d and t not in mine]
            if ref not in mine:
                continue
            a = rank_agreement(mine, ref)
            agreement["ok"] = agreement["ok"] and a["ok"]
            for t, v in a["ranks"].items():
                agreement["ranks"][t if len(dps) == 1 else f"dp{d}.tp{t}"] = v
        if missing:
            agreement["ok"] = False
            agreement["missing_ranks"] = missing
        summary["rank_agreement"] = agreement
    return summary, per_window


def attribute(cycles: list[dict], verify_ct: dict[str, int]) -> dict:
    """Cycles attributed to requests by the ``rids`` each cycle recorded, under SGLang's overlap rule:
    a request that result N finishes runs one more cycle that its ``spec_verify_ct`` does not count
    (scheduler.py 2107-2120, batch_result_processor.py 819-832). Per request, its first
    ``verify_ct[rid]`` cycles (in time order) are counted and the rest are in-flight extras, kept apart
    and counted. ``counted``: the cycles at least one request counted (the histogram and the checks use
    these); ``extra``: the cycles no request counted; cycles without ``rids`` (older profiles, an engine
    that passes no batch) stay ``counted`` and are numbered in ``without_rids``."""
    seen: dict[str, int] = {}
    per_request: dict[str, dict] = {}
    counted, extra, without = [], [], 0
    for c in sorted(cycles, key=lambda c: c["t"]):
        rids = c.get("rids")
        if not rids:
            without += 1
            counted.append(c)
            continue
        any_counted = False
        for rid in rids:
            seen[rid] = n = seen.get(rid, 0) + 1
            want = verify_ct.get(rid)
            req = per_request.setdefault(rid, {"cycles": 0, "counted": 0, "extra": 0, "spec_verify_ct": want})
            req["cycles"] += 1
            if want is None or n <= want:
                req["counted"] += 1
                any_counted = True
            else:
                req["extra"] += 1
        (counted if any_counted else extra).append(c)
    return {
        "counted": counted,
        "extra": extra,
        "extra_cycles": len(extra),
        "without_rids": without,
        "per_request": per_request,
        "matches_verify_ct": all(
            r["counted"] == r["spec_verify_ct"] for r in per_request.values() if r["spec_verify_ct"] is not None
        ),
    }
