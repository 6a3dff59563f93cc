"""The record's ``load`` section as types (issue 45): a job under load (benchmark.concurrency / request_rate)
summed by ``analysis.load.finish`` -- the protocol, the per-request spreads (``Spread``), the latency of its
requests (``record.sections.Latency``), the engine's running batch (``Running``, also each load run's in
``launches``), the outputs under load against bs 1 (``BatchInvariance``) and, under the paired strategy,
the paired baseline server's own section. The per-run figures (``runs``) stay the analysis's dicts.

Written as it always was (``as_dict``: its keys in the order ``analysis.load`` set them; the record writes
no ``load`` key without load); read back by ``load_from`` (a required key missing, or a value of another
shape, is a TypeError; keys it does not know are kept in ``extra``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spec_decode.record.sections import Latency, latency_from
from spec_decode.record.typed import ABSENT, Maybe, names, read, refuse, written


@dataclass
class Spread:
    """A per-request figure over a job's requests under load (``analysis.load``): tok/s or accept length."""

    p10: float
    p50: float
    p90: float
    p99: float
    mean: float
    n: int
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self)


@dataclass
class Running:
    """The engine's own count of requests in flight, from its decode-log lines (``analysis.load.running_batch``):
    the batch decoded (running), running + queued (in flight), and the share of lines at the concurrency."""

    lines: int
    running_median: float
    running_max: int
    running_mean: float
    in_flight_median: float
    in_flight_max: int
    at_concurrency_share: float
    running_histogram: dict[str, int]  # batch size -> lines
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self)


@dataclass
class BatchInvariance:
    """Each request's output under load against its prompt decoded alone (bs 1) on the same server."""

    requests: int  # compared
    equal: int
    what: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self)


@dataclass
class LoadSection:
    """One server's account of a job under load (``analysis.load.summarize``, completed by ``finish``)."""

    concurrency: int
    request_rate: float | None  # open loop: Poisson arrivals per second; None: closed loop
    mode: str
    requests: int
    runs: list[dict]  # per timed run: its figures (``LoadRun.figures``)
    request_tok_s: Spread | None
    accept_len_per_request: Spread | None
    latency: Latency  # no kind measured: written {}
    running: Running | None
    batch_invariance: BatchInvariance | Maybe = ABSENT
    profile_note: str | Maybe = ABSENT  # the record's own server only
    paired_baseline: LoadSection | Maybe = ABSENT  # the paired baseline server beside it (benchmark.paired)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = written(self, names(LoadSection))  # then its typed parts, each in its place
        for k, cls in PARTS.items():
            if (v := d.get(k)) is not None:
                refuse(f"load.{k}", v, cls)  # a dict where the type belongs is refused
                d[k] = v.as_dict()
        return d


PARTS = {
    "request_tok_s": Spread,
    "accept_len_per_request": Spread,
    "latency": Latency,
    "running": Running,
    "batch_invariance": BatchInvariance,
    "paired_baseline": LoadSection,
}


def running_from(data: dict | None) -> Running | None:
    return read(Running, data) if data is not None else None


def load_from(data: dict | None) -> LoadSection | None:
    """A ``load`` section as JSON holds it -> typed; None when absent (no load)."""
    if data is None:
        return None
    x = read(LoadSection, data)
    x.request_tok_s, x.accept_len_per_request = (
        read(Spread, v) if v is not None else None for v in (x.request_tok_s, x.accept_len_per_request)
    )
    x.latency = latency_from(x.latency) or Latency()
    x.running = running_from(x.running)
    if x.batch_invariance is not ABSENT:
        x.batch_invariance = read(BatchInvariance, x.batch_invariance)
    if x.paired_baseline is not ABSENT:
        x.paired_baseline = load_from(x.paired_baseline)
    return x
