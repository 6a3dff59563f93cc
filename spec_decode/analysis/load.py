"""Figures of a timed run under load (issue 28; the protocol is runner/load.py), and the record's ``load``
section with the lossless guard under load (``finish``, after ``analysis.finish.finish``).

A run under load is many requests at once. Per run and pooled over the job's runs:

- aggregate output tok/s = all requests' completion tokens / the run's wall time (first send to last
  answer): what ``throughput_tok_s`` and the speedup read, so the paired ratio compares like with like;
- per-request tok/s = each request's completion tokens / its own wall time (P50/P90/P99);
- TTFT / ITL / TPOT / E2E percentiles over the requests (``analysis.latency``; TTFT/ITL/TPOT only when
  the requests streamed, ``benchmark.stream=true``);
- accept length per request = its completion_tokens / spec_verify_ct (meta_info), P50/P10/P90;
- the running batch the engine saw: the ``#running-req`` (and ``#queue-req``) of the server's decode-log
  lines inside the run's window (``parsers.decode_log``) -- the engine's own count, not the client's.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from spec_decode.analysis import latency, lossless
from spec_decode.core.config import BenchmarkConfig
from spec_decode.parsers import decode_log
from spec_decode.parsers.decode_log import LogLine
from spec_decode.record.load import BatchInvariance, LoadSection, Running, Spread
from spec_decode.record.results import JobRecord, performance_only
from spec_decode.record.typed import ABSENT

SELF, PAIRED = "self", "paired_baseline"  # the record's own server, the paired baseline server beside it
_MEMORY = "_load_requests"  # the requests' RunRecords (token gaps, ids) in memory until finish: never written

RUNNING, QUEUED = "#running-req", "#queue-req"


def _dist(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    out = {f"p{q}": latency.percentile(values, q) for q in (10, 50, 90, 99)}
    out.update(mean=statistics.fmean(values), n=len(values))
    return out


def request_accept_len(r) -> float | None:
    """One request's accept length: committed tokens per verify (meta_info); None without verifies."""
    return r.completion_tokens / r.spec_verify_ct if getattr(r, "spec_verify_ct", None) else None


def _spread(values: Sequence[float]) -> Spread | None:
    d = _dist(values)
    return Spread(**d) if d else None


def running_batch(lines: Iterable[LogLine], concurrency: int) -> Running | None:
    """The engine's own count of requests in flight, from its decode-log lines: ``running`` (the batch
    decoded), ``in_flight`` = running + queued (what the clients hold), their median/max, the share of
    lines whose in-flight count is exactly ``concurrency`` and the histogram. None without lines."""
    running, in_flight = [], []
    for x in lines:
        if x.kind != "Decode" or not isinstance(x.fields.get(RUNNING), float):
            continue
        run = int(x.fields[RUNNING])
        q = x.fields.get(QUEUED)
        running.append(run)
        in_flight.append(run + (int(q) if isinstance(q, float) else 0))
    if not running:
        return None
    return Running(
        lines=len(running),
        running_median=statistics.median(running),
        running_max=max(running),
        running_mean=statistics.fmean(running),
        in_flight_median=statistics.median(in_flight),
        in_flight_max=max(in_flight),
        at_concurrency_share=sum(v == concurrency for v in in_flight) / len(in_flight),
        running_histogram={str(k): v for k, v in sorted(Counter(running).items())},
    )


def run_figures(requests: Sequence, wall_s: float) -> dict:
    """One timed run's figures from its requests (``client.RunRecord`` each) and its wall time."""
    tokens = sum(r.completion_tokens for r in requests)
    accept = [a for r in requests if (a := request_accept_len(r)) is not None]
    return {
        "requests": len(requests),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "aggregate_tok_s": tokens / wall_s if wall_s > 0 else None,
        "request_tok_s": _dist([r.throughput_tok_s for r in requests]),
        "accept_len_per_request": _dist(accept),
        "latency": latency.summarize(requests).as_dict(),
    }


def summarize(
    runs: Sequence[dict], requests: Sequence, concurrency: int, request_rate: float | None, running: Running | None
) -> LoadSection:
    """The job's ``load`` section: the protocol, per-run figures (``runs``: each ``run_figures`` plus its
    ``run`` index and ``running``), the pooled per-request figures and the engine's running batch."""
    accept = [a for r in requests if (a := request_accept_len(r)) is not None]
    return LoadSection(
        concurrency=concurrency,
        request_rate=request_rate,
        mode="open loop (Poisson arrivals)" if request_rate is not None else "closed loop",
        requests=len(requests),
        runs=list(runs),
        request_tok_s=_spread([r.throughput_tok_s for r in requests]),
        accept_len_per_request=_spread(accept),
        latency=latency.summarize(requests),
        running=running,
    )


def metrics_of(load: LoadSection) -> dict[str, float]:
    """Flat metrics (units in the names): ``concurrency``, ``request_rate_rps``, ``request_tok_s_p50``...,
    ``request_accept_len_p10/p50/p90``, ``load_<ttft|itl|tpot|e2e>_ms_p50/p90/p99``, ``running_req_*``."""
    m: dict[str, float] = {"concurrency": float(load.concurrency), "load_requests": float(load.requests)}
    if load.request_rate is not None:
        m["request_rate_rps"] = load.request_rate
    for name, d in (("request_tok_s", load.request_tok_s), ("request_accept_len", load.accept_len_per_request)):
        if d:
            m.update({f"{name}_p10": d.p10, f"{name}_p50": d.p50, f"{name}_p90": d.p90})
    for kind, dist in load.latency.kinds().items():
        m.update({f"load_{kind}_p50": dist.p50, f"load_{kind}_p90": dist.p90, f"load_{kind}_p99": dist.p99})
    if run := load.running:
        m.update(
            running_req_median=run.running_median,
            running_req_max=run.running_max,
            in_flight_req_median=run.in_flight_median,
            at_concurrency_share=run.at_concurrency_share,
        )
    return m


def describe(load: LoadSection) -> list[str]:
    """Console lines for a job under load."""
    rate = f", {load.request_rate:g} req/s" if load.request_rate is not None else ""
    lines = [f"  load: {load.mode}, concurrency {load.concurrency}{rate}, {load.requests} requests"]
    d, a, run = load.request_tok_s, load.accept_len_per_request, load.running
    if d:
        lines.append(
            f"  per request: tok/s P50 {d.p50:.1f} P90 {d.p90:.1f}"
            + (f"; accept len P10 {a.p10:.2f} P50 {a.p50:.2f} P90 {a.p90:.2f}" if a else "")
        )
    if run:
        lines.append(
            f"  engine's running batch (decode log, {run.lines} lines): median {run.running_median:g}, "
            f"max {run.running_max}; in flight = concurrency in {100 * run.at_concurrency_share:.0f}%"
        )
    if t := load.latency.ttft_ms:
        lines.append(f"  TTFT P50 {t.p50:.1f} P99 {t.p99:.1f} ms over {int(t.n)} requests")
    return lines


def _running(log_path: Path, windows: list[list[int]], concurrency: int) -> Running | None:
    if not log_path.exists():
        return None
    lines: list[str] = []
    with open(log_path, "rb") as f:
        for lo, hi in windows:
            f.seek(lo)
            lines += f.read(hi - lo).decode(errors="replace").splitlines()
    return running_batch(decode_log.parse_lines(lines), concurrency)


def finish(
    rec: JobRecord,
    b: BenchmarkConfig,
    baseline: JobRecord | None,
    log_path: Path,
    paired_log_path: Path | None,
    exact: bool,
) -> list[str]:
    """After ``analysis.finish.finish``: the record's ``load`` section and metrics, the lossless guard of
    every request under load against the baseline's bs-1 outputs (``exact``: the engine's outputs must be
    equal, else a divergence warns); console lines. Forgets the in-memory requests."""
    memory = rec.__dict__.pop(_MEMORY, None) or {SELF: [], PAIRED: []}
    runs = [x for launch in rec.launches for x in launch.load_runs or []]
    section: dict[str, LoadSection] = {}
    for arm, path in ((SELF, log_path), (PAIRED, paired_log_path)):
        mine = [x for x in runs if x.arm == arm]
        if not mine or path is None:
            continue
        for x in mine:
            x.running = _running(path, [x.log_window], b.concurrency)
        reqs = [r for batch in memory[arm] for r in batch]
        s = summarize(
            [x.figures() for x in mine],
            reqs,
            b.concurrency,
            b.request_rate,
            _running(path, [x.log_window for x in mine], b.concurrency),
        )
        entries = [e for x in mine for e in x.request_entries]
        s.batch_invariance = BatchInvariance(
            requests=sum(e.equals_reference is not None for e in entries),
            equal=sum(e.equals_reference is True for e in entries),
            what="each request's output vs its prompt decoded alone (bs 1) on the same server",
        )
        section[arm] = s
    if SELF not in section:
        return []
    s = section[SELF]
    s.profile_note = (
        "the phase profile comes from the profiled pass (the protocol request at bs 1), not from the runs under load"
    )
    if PAIRED in section:
        s.paired_baseline = section[PAIRED]
    rec.load = s
    rec.metrics.update(metrics_of(s))
    if rec.role == "spec":
        _guard(rec, b, baseline, exact)
    inv = s.batch_invariance
    lines = describe(s) + [f"  outputs under load equal bs 1 on this server: {inv.equal} of {inv.requests}"]
    return lines


def _guard(rec: JobRecord, b: BenchmarkConfig, baseline: JobRecord | None, exact: bool) -> None:
    """The lossless guard under load: every spec request's output vs the baseline's bs-1 output of its
    prompt (the paired baseline server's reference pass in the same launch, else the baseline job's)."""
    job_ref = {}
    if baseline is not None:
        job_ref = next((x.load_reference.get(SELF) for x in baseline.launches if x.load_reference), {}) or {}
    comparisons = []
    for launch in rec.launches:
        refs = launch.load_reference or {}
        mine, base = refs.get(SELF) or {}, refs.get(PAIRED) or job_ref
        for x in launch.load_runs or []:
            if x.arm != SELF:
                continue
            for e in x.request_entries:
                p = str(e.prompt_index)
                diverged = e.equals_reference is False  # its own ids written (see runner.load)
                ids = (None if e.output_ids is ABSENT else e.output_ids) if diverged else mine.get(p)
                comparisons.append(lossless.Comparison(f"load:{p}", ids, base.get(p), b.max_new_tokens))
    verdict = lossless.guard(
        comparisons,
        exact,
        b.temperature,
        performance_only(rec),
        has_baseline=bool(job_ref) or any(PAIRED in (x.load_reference or {}) for x in rec.launches),
    )
    verdict.what = "every request under load vs the baseline's output of its prompt at bs 1"
    rec.lossless = verdict
    rec.checks = [c for c in rec.checks if c.name != "lossless_vs_baseline"]
    if (check := lossless.check_of(verdict)) is not None:
        rec.checks.append(check)
    if verdict.checked:
        rec.metrics["lossless_match_rate"] = float(verdict.match_rate)
    elif verdict.verdict == "warn":
        rec.warnings.append(f"lossless guard: {verdict.reason}")
