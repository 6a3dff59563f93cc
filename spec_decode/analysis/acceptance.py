"""Per-request and per-position acceptance (issue 21): pure functions of what a job measured.

Two sources, the first that is present wins:

- ``profile``: the phase profile's per-cycle ``accepted`` counts (rank 0, inside the timed runs'
  windows; ``parsers.profile``). ``accepted`` is the tokens a cycle committed, the bonus included, for
  the one request of the batch (the protocol runs one request at a time), so the drafts a verify
  accepted are ``accepted - 1``; a count outside 0..steps (a batch of several requests) makes the
  profile unusable here and the meta_info source is used;
- ``meta_info``: each request's ``spec_correct_drafts_histogram`` (index a = verifies that accepted
  a drafts), summed over the requests.

From the histogram h[0..k] (k = steps, N = sum h verifies):

- the acceptance rate at draft position i: ``rate_i = P(accepted >= i | accepted >= i-1)`` =
  sum_{a>=i} h[a] / sum_{a>=i-1} h[a] (None where no verify reached position i-1);
- accept length per request, two ways, both named: ``accept_len_weighted`` = sum completion / sum
  verify (each verify counts once: long requests weigh more; the run-scoped figure) and
  ``accept_len_unweighted`` = the mean of the per-request completion / verify (each request counts once).

The requests are the job's request pass over its prompt set where it has one (``rec.requests``), else
its timed runs; ``requests_from`` says which.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spec_decode.record.measured import Request
from spec_decode.record.sections import Acceptance

SOURCES = ("profile", "meta_info")


@dataclass
class Counted:
    """A timed run's counters as the per-request acceptance reads them (the request pass's entries,
    ``record.measured.Request``, have the same three)."""

    completion_tokens: int
    verify_ct: int | None
    histogram: list[int] | None  # index a: verifies that accepted a drafts


def histogram_from_cycles(cycles: Iterable[dict], steps: int) -> list[int] | None:
    """Verifies by accepted drafts (0..steps) from profile cycles; None when a cycle's count does not
    fit one request's verify (missing, not a whole number, or ``accepted - 1`` outside 0..steps)."""
    hist = [0] * (steps + 1)
    for c in cycles:
        acc = c.get("accepted")
        if acc is None or acc != int(acc) or not 0 <= acc - 1 <= steps:
            return None
        hist[int(acc) - 1] += 1
    return hist


def add_histograms(hists: Iterable[Sequence[int] | None], steps: int) -> list[int] | None:
    """The sum of per-request histograms (None if any is missing or longer than steps + 1)."""
    total = [0] * (steps + 1)
    seen = False
    for h in hists:
        if h is None or len(h) > steps + 1:
            return None
        for a, n in enumerate(h):
            total[a] += int(n)
        seen = True
    return total if seen else None


def per_position_rates(hist: Sequence[int]) -> list[float | None]:
    """rate_i = P(accepted >= i | accepted >= i-1) for i = 1..len(hist)-1."""
    reach = [sum(hist[i:]) for i in range(len(hist))]  # reach[i]: verifies that accepted >= i drafts
    return [reach[i] / reach[i - 1] if reach[i - 1] else None for i in range(1, len(hist))]


def accept_len_from_rates(rates: Sequence[float]) -> float:
    """Expected tokens per verify (bonus included) of a chain with these conditional rates:
    1 + sum_i prod_{j<=i} rate_j."""
    total, p = 1.0, 1.0
    for r in rates:
        p *= r
        total += p
    return total


def request_lengths(requests: Sequence[Counted | Request]) -> tuple[float | None, float | None]:
    """(weighted, unweighted) accept length over requests (``completion_tokens``, ``verify_ct``):
    sum completion / sum verify, and the mean of the per-request ratios."""
    have = [r for r in requests if r.verify_ct]
    if not have:
        return None, None
    weighted = sum(r.completion_tokens for r in have) / sum(r.verify_ct for r in have)
    unweighted = sum(r.completion_tokens / r.verify_ct for r in have) / len(have)
    return weighted, unweighted


def summarize(
    steps: int,
    runs: Sequence,
    run_cycles: Sequence[Sequence[dict]] | None = None,
    pass_requests: Sequence[Request] | None = None,
) -> Acceptance | None:
    """The job's ``acceptance`` per position and per request (see the module doc; the counters' group is
    the runs', ``analysis.sections.acceptance_counters``) or None without a single verify.

    ``runs``: the timed runs (``client.RunRecord``: ``completion_tokens``, ``spec_verify_ct``, and,
    where the client reads it, ``spec_correct_drafts_histogram``); ``run_cycles``: each run's profile
    cycles (rank 0, its window), or None without a profile; ``pass_requests``: the request pass's
    entries, if any."""
    timed = [
        Counted(r.completion_tokens, r.spec_verify_ct, getattr(r, "spec_correct_drafts_histogram", None)) for r in runs
    ]
    meta = add_histograms((t.histogram for t in timed), steps)
    prof = None
    if run_cycles and len(run_cycles) == len(timed) and any(run_cycles):
        per_run = [histogram_from_cycles(c, steps) for c in run_cycles]
        if all(h is not None for h in per_run):
            prof = add_histograms(per_run, steps)
            for t, h in zip(timed, per_run):
                t.histogram = h
    if prof is not None:
        hist, source = prof, "profile"
    elif meta is not None:
        hist, source = meta, "meta_info"
    else:
        pass_hist = add_histograms((r.histogram for r in pass_requests or []), steps)
        hist, source = pass_hist, ("meta_info" if pass_hist is not None else None)
    requests_from = "request pass" if pass_requests else "timed runs"
    reqs: list[Counted | Request] = list(pass_requests) if pass_requests else list(timed)
    weighted, unweighted = request_lengths(reqs)
    if weighted is None and hist is None:
        return None
    per_request = [
        {
            "index": i,
            "completion_tokens": r.completion_tokens,
            "verify_ct": r.verify_ct,
            "accept_len": r.completion_tokens / r.verify_ct if r.verify_ct else None,
            "histogram": r.histogram,
        }
        for i, r in enumerate(reqs)
    ]
    return Acceptance(
        steps=steps,
        histogram=hist,
        per_position=per_position_rates(hist) if hist is not None and sum(hist) else None,
        source=source,
        histogram_scope="timed runs" if source == "profile" or meta is not None else requests_from,
        accept_len_weighted=weighted,
        accept_len_unweighted=unweighted,
        requests_from=requests_from,
        per_request=per_request,
        # Two records of the same verifies: the server's counters and the profiler's cycles.
        profile_matches_meta_info=prof == meta if prof is not None and meta is not None else None,
    )


def metrics_of(acc: Acceptance | None) -> dict[str, float]:
    """The flat metrics (MLflow's): accept_len_request_weighted, accept_len_request_mean,
    accept_rate_pos<i> (i = 1..steps, where measured)."""
    if not acc:
        return {}
    out: dict[str, float] = {}
    if acc.accept_len_weighted is not None:
        out["accept_len_request_weighted"] = acc.accept_len_weighted
    if acc.accept_len_unweighted is not None:
        out["accept_len_request_mean"] = acc.accept_len_unweighted
    for i, r in enumerate(acc.per_position or [], start=1):
        if r is not None:
            out[f"accept_rate_pos{i}"] = r
    return out


def rates_from_metrics(metrics: dict[str, float]) -> list[float]:
    """accept_rate_pos1..n from flat metrics, up to the first position not measured."""
    out = []
    while f"accept_rate_pos{len(out) + 1}" in metrics:
        out.append(metrics[f"accept_rate_pos{len(out) + 1}"])
    return out
