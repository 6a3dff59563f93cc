"""The record's measured sections as types (issue 45): what the runner fills while the job runs --
``launches`` (a ``Launch`` per server launch: its servers, warmup, pairs, the host's load over its timed
runs (``HostWindow``) and, under load, its runs (``LoadRun`` of ``LoadRequest``s)), ``requests`` (a
``Request`` per prompt of the request pass) and ``profile_pass`` (``ProfilePass``: the profiled pass's
account; ``analysis.sections.profiler_cost`` adds the profiler's effect).

Each writes the JSON it always had (``as_dict``: its keys in the order the runner set them; a key a
launch never got stays absent) and reads it back (``*_from``: a required key missing, or a value of
another shape, is a TypeError; keys it does not know are kept in ``extra``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spec_decode.record.load import Running, running_from
from spec_decode.record.typed import ABSENT, Maybe, names, read, refuse, written


@dataclass
class ProcCpu:
    """One process of a server's tree over a launch's timed runs (``runner.machine.tree_window``): its CPU
    time there, read from /proc at both ends (outside the timed runs)."""

    name: str  # its role: "launcher" for the tree's root, else its process name (SGLang's titles, our ranks')
    pid: int
    cpu_s: float  # user + system seconds of its own threads (not its children's) over the window
    core_pct: float  # cpu_s / the window's seconds x 100: % of one core (over 100: several busy threads)
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(ProcCpu))


@dataclass
class HostWindow:
    """How busy the host was over a launch's timed runs (``runner.machine.window``; shares of all cores'
    time in %, where /proc/stat was read at both ends), and each server process's CPU time over them
    (``server_procs``; the paired baseline server's: ``baseline_procs``)."""

    s: float
    load1_start: float | None  # 1-minute load average; None: /proc/loadavg not read
    load1_end: float | None
    busy_pct: float | None = None
    steal_pct: float | None = None
    iowait_pct: float | None = None
    probe_us_start: float | None = None  # runner.machine.probe_us at each end; None: before the probe
    probe_us_end: float | None = None
    server_procs: list[ProcCpu] | Maybe = ABSENT  # absent: recorded before the per-process account
    procs_s: float | None = None  # the seconds between the two reads of the trees (their core_pct's window)
    baseline_procs: list[ProcCpu] | Maybe = ABSENT
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = written(self, ("load1_start", "load1_end"))
        for key in ("server_procs", "baseline_procs"):
            if (procs := getattr(self, key)) is not ABSENT:
                d[key] = [_json(f"host.{key}[]", p, ProcCpu) for p in procs]
        return d


@dataclass
class LoadRequest:
    """One request of a timed run under load (``runner.load.LoadRunner``)."""

    i: int
    prompt_index: int
    sent_s: float  # from the run's start
    scheduled_s: float | None  # open loop: its Poisson arrival time; None: closed loop
    wall_s: float
    completion_tokens: int
    prompt_tokens: int
    spec_verify_ct: int | None
    tok_s: float
    accept_len: float | None
    ttft_s: float | None
    output_sha256: str | None
    equals_reference: bool | None  # its output vs its prompt decoded alone (bs 1); None: not compared
    output_ids: list[int] | Maybe = ABSENT  # only where it diverged (the guard names the position)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(LoadRequest))


@dataclass
class LoadRun:
    """One timed run under load: its arm, its window in the server log, its figures
    (``analysis.load.run_figures``: ``requests`` .. ``latency``, the analysis's dicts) and its requests;
    ``running`` (the engine's running batch in its window, ``record.load.Running``) is added by
    ``analysis.load.finish``."""

    arm: str  # analysis.load.SELF | PAIRED
    run: int
    log_window: list[int]  # [start, end) byte offsets in the server log
    requests: int
    completion_tokens: int
    wall_s: float  # first send -> last answer
    aggregate_tok_s: float | None
    request_tok_s: dict | None
    accept_len_per_request: dict | None
    latency: dict
    request_entries: list[LoadRequest]
    running: Running | None | Maybe = ABSENT
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict:
        """Its JSON without its requests (the load section's per-run figures)."""
        return {k: v for k, v in self.as_dict().items() if k != "request_entries"}

    def as_dict(self) -> dict:
        d = written(self, names(LoadRun))
        if self.running:
            d["running"] = _json("load_runs[].running", self.running, Running)
        d["request_entries"] = [_json("load_runs[].request_entries[]", e, LoadRequest) for e in self.request_entries]
        return d


@dataclass
class Launch:
    """One server launch (``runner.job``): its server (and the paired baseline server beside it), the
    warmup's wall time, under load the bs-1 reference outputs and the runs, the pairs' timing
    (``runner.pairing``) and the host's load over its timed runs. A key is set as the launch gets that
    far (None: absent from the JSON)."""

    launch: int
    port: int
    pid: int
    server_start_s: float | None
    server_nice: int | None = None  # benchmark.server_nice, read back
    baseline_port: int | None = None  # the paired baseline server (benchmark.paired)
    baseline_pid: int | None = None
    baseline_server_start_s: float | None = None
    pairing: str | None = None  # benchmark.pairing: interleaved | concurrent
    baseline_server_nice: int | None = None
    warmup_s: float | None = None  # the warmup requests' wall time (both servers': ours)
    load_reference: dict[str, dict[str, list[int] | None]] | None = None  # arm -> prompt -> its bs-1 ids
    load_runs: list[LoadRun] | None = None
    pairs: list[dict] | None = None  # per pair: the pairer's account (order, or cores, delays, overlap)
    host: HostWindow | None = None
    server_cpus: list[int] | None = None  # benchmark.server_cpus: the tree's cores, read back
    baseline_server_cpus: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = written(self, ("server_start_s",))  # then its typed parts, each in its place
        if self.load_runs is not None:
            d["load_runs"] = [_json("load_runs[]", x, LoadRun) for x in self.load_runs]
        if self.host is not None:
            d["host"] = _json("host", self.host, HostWindow)
        return d


def _json(name: str, value: Any, cls: type) -> dict:
    """A part's JSON, in its place; a value of another type (a dict) refused."""
    refuse(f"launches[].{name}", value, cls)
    return value.as_dict()


def _load_run(data: Any) -> LoadRun:
    x = read(LoadRun, data)
    x.request_entries = [read(LoadRequest, e) for e in _array(x.request_entries, "request_entries")]
    if x.running is not ABSENT:
        x.running = running_from(x.running)
    return x


def _launch(data: Any) -> Launch:
    x = read(Launch, data)
    if x.load_runs is not None:
        x.load_runs = [_load_run(r) for r in _array(x.load_runs, "load_runs")]
    if x.host is not None:
        x.host = _host(x.host)
    return x


def _host(data: Any) -> HostWindow:
    x = read(HostWindow, data)
    for key in ("server_procs", "baseline_procs"):
        if (procs := getattr(x, key)) is not ABSENT:
            setattr(x, key, [read(ProcCpu, p) for p in _array(procs, key)])
    return x


def _array(data: Any, what: str) -> list:
    if not isinstance(data, list):
        raise TypeError(f"{what}: a JSON array expected, got {type(data).__name__}")
    return data


def launches_from(data: list | None) -> list[Launch]:
    """The ``launches`` section as JSON holds it -> typed (absent: none)."""
    return [_launch(x) for x in _array(data or [], "launches")]


@dataclass
class Request:
    """One request of the request pass (``runner.request_pass.entry``): its prompt, counters, tok/s and the
    hash of its output ids (the ids themselves: ``outputs.jsonl``). Every key written, null where not
    measured (a baseline has no verify counts, an unstreamed request no TTFT)."""

    prompt_index: int
    category: str | None
    completion_tokens: int
    wall_s: float
    throughput_tok_s: float
    accept_len: float | None  # completion tokens / verifies
    verify_ct: int | None
    correct_drafts: int | None
    histogram: list[int] | None  # index a: verifies that accepted a drafts
    ttft_ms: float | None
    output_sha256: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(Request))


def requests_from(data: list | None) -> list[Request]:
    """The ``requests`` section as JSON holds it -> typed (absent: none)."""
    return [read(Request, x) for x in _array(data or [], "requests")]


@dataclass
class ProfilePass:
    """The profiled pass's account (``runner.profile_pass.run``): its (on, dormant) pairs, their order, the
    launch it ran in and the dormant runs' tok/s (the profiled runs are the record's ``profiled_runs``).
    ``effect`` (the profiler's effect on tok/s, ``analysis.profiler_effect.effect``: None without a pair)
    is absent until ``analysis.sections.profiler_cost`` adds it."""

    pairs: int
    order: str
    launch: int
    dormant_tok_s: list[float]
    effect: dict | None | Maybe = ABSENT
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(ProfilePass))


def profile_pass_from(data: dict | None) -> ProfilePass | None:
    """A ``profile_pass`` section as JSON holds it -> typed; None when absent (no profiled pass)."""
    return read(ProfilePass, data) if data is not None else None
