"""The record's derived sections as types (issue 45): what ``analysis`` computes and ``results.JobRecord``
holds -- tok/s over the runs (``Summary``), the speedup (``Ratio``, ``Speedup``), the acceptance
(``Acceptance``), the token latency (``Latency`` of ``Distribution``s), the phase profile (``Profile``) and
the launches' share of the tok/s variance (``VarianceComponents``), the engine's decode log (``DecodeLog``),
the request pass per prompt category (``Category``) and the lossless guard's verdict (``Lossless``). Each writes the JSON it always
had (``as_dict``: its keys, in their order; a key the section never had stays absent) and reads it back
(``*_from``: results.json and metrics.json alike; keys it does not know are kept in ``extra`` and written
back after its own). ``analysis.stats`` builds ``Summary``, ``Ratio`` and ``VarianceComponents``: they sit here, below it, so the
record imports nothing of ``analysis``.

A record rebuilt from metrics.json holds what that file keeps of a section (a ``Summary`` without its
median, a ``Speedup`` with its method only): a field it lacks is None, and a None field is not written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from spec_decode.record.typed import ABSENT, Maybe, names, read, written


@dataclass
class Summary:
    """tok/s over a job's timed runs (``analysis.stats.summarize``): mean, t-CI, CVs. metrics.json keeps
    all but the median."""

    n: int | None = None
    mean: float | None = None
    median: float | None = None
    std: float | None = None
    cv: float | None = None
    ci95_lo: float | None = None
    ci95_hi: float | None = None
    # 1.4826 x MAD / median: estimates the CV for normal noise, and one outlier of five runs (a
    # neighbour's burst on a shared host) does not move it; spec_decode.analysis.recommend's stability verdict
    robust_cv: float | None = None
    unit: str | None = None  # "block means": a cell folded over its blocks (analysis.blocks); None: the runs
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self)


def summary_from(data: dict | None) -> Summary | None:
    """A ``throughput_tok_s`` section (or a baseline's) as JSON holds it -> typed; None when absent."""
    return read(Summary, data) if data else None


@dataclass
class Ratio:
    """mean(A) / mean(B) (or the geometric mean of paired ratios) with its 95% CI (``analysis.stats``)."""

    ratio: float
    ci95_lo: float
    ci95_hi: float
    df: float
    significant: bool  # the CI excludes 1.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


METHODS = ("paired", "welch", "blocks")


@dataclass
class Speedup:
    """The record's ``speedup_vs_baseline``: a ``Ratio``'s figures and how it was measured (``method``),
    with what that method adds (paired: its pairs; blocks: the per-block ratios and the rerun interval).
    metrics.json keeps the method only."""

    ratio: float | None = None
    ci95_lo: float | None = None
    ci95_hi: float | None = None
    df: float | None = None
    significant: bool | None = None
    method: str | None = None  # one of METHODS; None: a record from before the method was written (welch)
    pairs: int | None = None  # paired
    pairing: str | None = None  # paired: which pairing ran (runner.pairing)
    per_pair: list[float] | None = None  # paired
    per_block: list[float] | None = None  # blocks
    rerun95: list[float] | None = None  # blocks: where an equal-size rebuild's speedup lands
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, r: Ratio, method: str, **how: Any) -> Speedup:
        return cls(r.ratio, r.ci95_lo, r.ci95_hi, r.df, r.significant, method, **how)

    @property
    def how(self) -> str:
        """The method, welch where the record does not say (the only one before the others)."""
        return self.method or "welch"

    def as_dict(self) -> dict:
        return written(self)


def speedup_from(data: dict | None) -> Speedup | None:
    """A ``speedup_vs_baseline`` section as JSON holds it -> typed; None when absent."""
    return read(Speedup, data) if data else None


# the two groups of ``Acceptance``, each written whole when any of its fields is set
COUNTERS = ("accept_len", "accept_rate_draft", "accept_rate_incl_bonus", "accept_len_source", "per_run_accept_len")
BY_REQUEST = ("steps", "histogram", "per_position", "source", "histogram_scope", "accept_len_weighted")
BY_REQUEST += ("accept_len_unweighted", "requests_from", "per_request")


@dataclass
class Acceptance:
    """The record's ``acceptance``: two groups, each written whole (its None values too) when it is there.

    The run-scoped counters (``analysis.sections.acceptance_counters``: ``COUNTERS``), and the acceptance per
    draft position and per request (``analysis.acceptance.summarize``: ``BY_REQUEST``; with
    ``profile_matches_meta_info`` where both sources had the histogram). metrics.json keeps the histogram,
    its source, the rates per position and the two accept lengths per request."""

    accept_len: float | None = None  # completion tokens / verifies (SGLang's spec_accept_length)
    accept_rate_draft: float | None = None  # correct drafts / proposed drafts
    accept_rate_incl_bonus: float | None = None  # accepted tokens / (verifies x num_draft_tokens)
    accept_len_source: str | None = None
    per_run_accept_len: list[float] | None = None
    steps: int | None = None
    histogram: list[int] | None = None  # index a: verifies that accepted a drafts
    per_position: list[float | None] | None = None  # P(accepted >= i | accepted >= i-1), i = 1..steps
    source: str | None = None  # "profile" | "meta_info" (analysis.acceptance.SOURCES)
    histogram_scope: str | None = None
    accept_len_weighted: float | None = None  # sum completion / sum verify over the requests
    accept_len_unweighted: float | None = None  # the mean of the per-request accept lengths
    requests_from: str | None = None  # "request pass" | "timed runs"
    per_request: list[dict] | None = None  # {index, completion_tokens, verify_ct, accept_len, histogram}
    profile_matches_meta_info: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def with_requests(self, other: Acceptance) -> Acceptance:
        """These counters with ``other``'s per-position and per-request group."""
        return dataclasses.replace(self, **{k: getattr(other, k) for k in (*BY_REQUEST, "profile_matches_meta_info")})

    def as_dict(self) -> dict:
        d = {
            k: getattr(self, k)
            for g in (COUNTERS, BY_REQUEST)
            if any(getattr(self, k) is not None for k in g)
            for k in g
        }
        if self.profile_matches_meta_info is not None:
            d["profile_matches_meta_info"] = self.profile_matches_meta_info
        return {**d, **self.extra}


def acceptance_from(data: dict | None) -> Acceptance | None:
    """An ``acceptance`` section as JSON holds it -> typed; None when absent."""
    return read(Acceptance, data) if data else None


@dataclass
class Distribution:
    """Percentiles of one latency (ms), with the sample count (``analysis.latency.distribution``)."""

    p50: float
    p90: float
    p99: float
    mean: float
    n: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Latency:
    """The record's ``latency``: TTFT / ITL / TPOT / E2E of the streamed timed runs (``analysis.latency``);
    a kind no run measured is None (absent from the JSON); no kind at all: the record holds None."""

    ttft_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    tpot_ms: Distribution | None = None
    e2e_ms: Distribution | None = None

    def kinds(self) -> dict[str, Distribution]:
        """The measured kinds by name, in ``analysis.latency.KINDS`` order."""
        return {f.name: d for f in dataclasses.fields(self) if (d := getattr(self, f.name)) is not None}

    def as_dict(self) -> dict:
        return {k: d.as_dict() for k, d in self.kinds().items()}


def latency_from(data: dict | None) -> Latency | None:
    """A ``latency`` section as JSON holds it -> typed; None when absent or empty."""
    if not data:
        return None
    kinds = {f.name for f in dataclasses.fields(Latency)}
    if unknown := set(data) - kinds:
        raise TypeError(f"latency: unknown kinds {sorted(unknown)}")
    return Latency(**{k: Distribution(**d) for k, d in data.items()})


@dataclass
class VarianceComponents:
    """tok/s of launches x runs split one-way (``analysis.stats.variance_components``): the std within a
    launch and between launches, and the share of the variance between them; None without two launches
    of two runs each (its four keys always written)."""

    launches: int
    std_within: float | None
    std_between: float | None
    between_share: float | None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def variance_components_from(data: dict | None) -> VarianceComponents | None:
    """A ``variance_components`` section as JSON holds it -> typed; None when absent."""
    if not data:
        return None
    if not isinstance(data, dict):
        raise TypeError(f"VarianceComponents: a JSON object expected, got {type(data).__name__}")
    return VarianceComponents(**data)


@dataclass
class Profile:
    """The record's ``profile``: the phase profile of one rank's cycles inside the profiled windows
    (``parsers.profile.summarize_run_windows``: ``cycles`` .. ``rank_agreement``), completed by
    ``analysis.sections.phase_profile`` (``per_run`` .. ``host_stamps_na``); or, without one, why
    (``missing``, then its only field). Its parts from the parser (``rank_agreement``, each ``per_run``
    entry: ``parsers.profile.run_timing``) are the parser's dicts."""

    cycles: int | None = None
    cycle_ms: float | None = None  # mean
    cycle_ms_median: float | None = None
    draft_ms: float | None = None
    draft_pct: float | None = None  # of the cycle
    verify_ms: float | None = None
    verify_pct: float | None = None
    extend_ms: float | None = None
    extend_pct: float | None = None
    other_ms: float | None = None
    other_pct: float | None = None
    batch_size_mean: float | None = None
    accept_len: float | None = None
    tok_s_from_profile: float | None = None
    extra_cycles: int | None = None  # the in-flight cycles no request counted, set apart
    ranks: int | None = None
    replicas: int | None = None
    rank: int | None = None  # whose cycles these are
    rank_agreement: dict | None = None  # several ranks: each other rank's cycles vs this one's
    per_run: list[dict | None] | None = None  # per profiled request: where its wall time went
    non_cycle_ms_per_request: float | None = None  # written null where no request has its timing
    spec_verify_ct: int | None = None  # the profiled requests' verifies: one cycle each
    measured_in: str | None = None
    measured_in_tok_s: float | None = None
    complete: bool | None = None  # cycles == spec_verify_ct
    host_stamps_na: str | None = None  # why the host's cycle stamps are not the device's (the engine's rule)
    missing: str | None = None  # no profile: why
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, () if self.missing is not None else ("non_cycle_ms_per_request",))


def profile_from(data: dict | None) -> Profile | None:
    """A ``profile`` section as JSON (or the parser) holds it -> typed; None when absent."""
    return read(Profile, data) if data else None


@dataclass
class DecodeLog:
    """The record's ``decode_log``: the engine's own ``Decode batch`` lines inside the timed windows
    (``analysis.sections.decode_log_summary``, from ``parsers.decode_log.DecodeSummary``): every key
    written, null where nothing was read; a key an older record lacks stays absent (``ABSENT``)."""

    lines: int | Maybe = ABSENT  # decode lines in the windows
    used_lines: int | Maybe = ABSENT  # without the first line after an idle gap (its throughput understated)
    gen_throughput_tok_s_median: float | None | Maybe = ABSENT
    accept_len_median: float | None | Maybe = ABSENT
    accept_rate_median: float | None | Maybe = ABSENT
    graph: bool | None | Maybe = ABSENT  # every used line ran a CUDA graph; None: no line said
    notes: list[str] | Maybe = ABSENT
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(DecodeLog))


def decode_log_from(data: dict | None) -> DecodeLog | None:
    """A ``decode_log`` section as JSON holds it -> typed; None when absent."""
    return read(DecodeLog, data) if data is not None else None


@dataclass
class Category:
    """The request pass's figures for one prompt category (the record's ``categories``: name -> Category)."""

    n: int  # requests
    accept_len: float | None  # sum of completion tokens / sum of verify counts; None without counters (a baseline)
    throughput_tok_s: float  # the median request's tok/s

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Lossless:
    """The lossless guard's verdict (``analysis.lossless``): the speculative outputs against the baseline's."""

    checked: bool  # False: nothing compared (``reason`` says why)
    requests: int  # outputs compared
    matched: int
    match_rate: float | None
    first_divergence: dict[str, int]  # per prompt that differed: the first token index where it did
    verdict: str  # "pass", "fail", "warn" (an engine whose outputs may differ) or "skipped"
    reason: str
    what: str | None = None  # what was compared, where not the timed runs and the request pass (under load)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.what is None:
            del d["what"]
        return d


def lossless_from(data: dict | None) -> Lossless | None:
    """The ``lossless`` section as JSON holds it (results.json, metrics.json) -> typed; None when absent."""
    if not data:
        return None
    return Lossless(**{f.name: data[f.name] for f in dataclasses.fields(Lossless) if f.name in data})


def categories_from(data: dict | None) -> dict[str, Category]:
    """The ``categories`` section as JSON holds it (results.json, metrics.json) -> typed, in its order."""
    return {name: Category(c["n"], c["accept_len"], c["throughput_tok_s"]) for name, c in (data or {}).items()}
