"""results.json: the one authoritative record of a job (DESIGN §3.5), typed.

``JobRecord`` is the record's type; this module holds its JSON form, the one write (``write``) and the
reading (``read``, ``collect``). The job builds it when it starts (``runner.context.new_record``),
fills it while it runs and completes it (``analysis.finish.finish``: the derived sections, each a pure
function of ``analysis.sections`` and the modules it names) before the one write. MLflow (``tracking``),
reports (``report``) and DVC metrics (``experiment``) only read it: ``collect`` finds the records under
a directory.

The JSON shape is that of schema 1 plus typed nesting; ``JobRecord.from_dict`` reads both (keys it
does not know are kept in ``extra`` and written back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spec_decode.record import provenance
from spec_decode.record.load import LoadSection, load_from
from spec_decode.record.measured import Launch, ProfilePass, Request, launches_from, profile_pass_from, requests_from
from spec_decode.record.payloads import (
    DoctorItem,
    NcclProbe,
    ServerInfo,
    doctor_from,
    nccl_probe_from,
    server_info_from,
)
from spec_decode.record.provenance import Provenance, provenance_from
from spec_decode.record.runs import RunRecord
from spec_decode.record.sections import (
    Acceptance,
    Category,
    DecodeLog,
    Latency,
    Lossless,
    Profile,
    Speedup,
    Summary,
    VarianceComponents,
    acceptance_from,
    categories_from,
    decode_log_from,
    latency_from,
    lossless_from,
    profile_from,
    speedup_from,
    summary_from,
    variance_components_from,
)
from spec_decode.record.typed import refuse

# 2: typed record, drift and checks computed by the job, preflight failures recorded
# 3: streamed runs (latency), request pass (requests, categories), lossless guard, pairing, acceptance by
#    position and per request (absent sections read as empty: schema 1 and 2 records still load)
SCHEMA_VERSION = 3
FILENAME = "results.json"
STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not applicable
    value: Any
    expected: str
    message: str  # what was compared with what, with the numbers

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Drift:
    earlier_runs: int
    earlier_run_ids: list[str]
    interval_tok_s: list[float] | None
    throughput_tok_s: float
    outside_interval: bool
    env_differences: list[str]
    message: str | None = None  # set when there is something to warn about
    provenance_differences: list[str] = field(default_factory=list)  # hashes, engine version
    note: str | None = None  # e.g. "too few earlier baselines": said, not warned

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class EngineInfo:
    name: str
    version: str | None = None
    nccl_inert: str | None = None  # why no NCCL runs in this job (the engine's answer); None: it may run


@dataclass
class BaselineRef:
    """The baseline a spec job's speedup is measured against."""

    out_dir: str | None
    mlflow_run_id: str | None
    throughput_tok_s: Summary | None  # its tok/s

    def as_dict(self) -> dict:
        t = self.throughput_tok_s
        return {"out_dir": self.out_dir, "mlflow_run_id": self.mlflow_run_id, "throughput_tok_s": t and t.as_dict()}


RUN_LISTS = ("runs", "baseline_runs", "profiled_runs", "profiled_requests")  # lists of RunRecord in a record
# The sections held as one typed object (or None): written by its ``as_dict``; a value of another type (a
# dict where the type belongs) is refused at the write. Absent: null, but {} for ``lossless`` and
# ``latency`` (what they were written as before they were typed).
TYPED = {
    "engine": EngineInfo,
    "baseline": BaselineRef,
    "drift": Drift,
    "throughput_tok_s": Summary,
    "variance_components": VarianceComponents,
    "speedup_vs_baseline": Speedup,
    "acceptance": Acceptance,
    "latency": Latency,
    "profile": Profile,
    "lossless": Lossless,
    "profile_pass": ProfilePass,
    "decode_log": DecodeLog,
    "provenance": Provenance,
    "server_info": ServerInfo,
    "nccl_probe": NcclProbe,
    "load": LoadSection,
}
# lists of typed entries, each refused if of another type; ``doctor`` may be None (no live items: null)
LISTS = {"launches": Launch, "requests": Request, "doctor": DoctorItem}
ABSENT_AS_EMPTY = ("lossless", "latency")
NOT_WRITTEN_WHEN_NONE = ("load",)  # no key at all (a job without load), as before it was typed


@dataclass
class JobRecord:
    role: str  # spec | baseline
    name: str  # the job's overrides (Hydra's override_dirname); "baseline,<...>" for a baseline
    experiment: str
    config: dict[str, Any]  # the resolved config
    config_hash: str
    engine: EngineInfo
    speculative: bool
    schema_version: int = SCHEMA_VERSION
    status: str = "RUNNING"  # RUNNING | FINISHED | FAILED | KILLED
    error: str | None = None
    # Refused before any server started, for bad input: "config" (the typed config's own rules) or
    # "preflight". A sweep with such a job exits 2 (the other jobs still run).
    refused: str | None = None
    overrides: list[str] = field(default_factory=list)
    record_id: str = field(default_factory=lambda: os.urandom(8).hex())
    server_env_extra: dict[str, str] = field(default_factory=dict)  # what we add (redacted)
    server_env: dict[str, str] | None = None  # read back from the live server process (filtered)
    server_env_processes: dict[str, dict[str, str]] | None = None  # every server process (TP ranks), by pid
    server_env_set_by_engine: dict[str, str] = field(default_factory=dict)  # written by its launcher for the ranks
    argv: list[str] | None = None
    slots: list[str] | None = None
    launches: list[Launch] = field(default_factory=list)  # one per server launch (record.measured)
    runs: list[RunRecord] = field(default_factory=list)
    # Paired baseline (benchmark.paired): the baseline server's timed runs, interleaved with ``runs``
    # (pair i = runs[i], baseline_runs[i]).
    baseline_runs: list[RunRecord] = field(default_factory=list)
    # The profiled pass (benchmark.profile; spec_decode/runner/profile_pass.py): after the timed runs,
    # which ran with the hooks dormant, the profiler-on runs of its (on, dormant) pairs -- the profile's
    # windows -- and the pass's account with the profiler's measured effect on tok/s.
    profiled_runs: list[RunRecord] = field(default_factory=list)
    # Under load (benchmark.concurrency / request_rate) a profiled run is a whole load run (its aggregate
    # above); its requests, each with its rid and counters, are the profile's windows (batched cycles are
    # attributed to every request they served).
    profiled_requests: list[RunRecord] = field(default_factory=list)
    profile_pass: ProfilePass | None = None  # None: no profiled pass (record.measured)
    warnings: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    out_dir: str = ""
    provenance: Provenance = field(default_factory=Provenance)  # what explains a number (record.provenance)
    server_info: ServerInfo | None = None  # the engine's /server_info (record.payloads)
    nccl_probe: NcclProbe | None = None  # the NCCL probe's result (preflight.nccl_probe; record.payloads)
    doctor: list[DoctorItem] | None = None  # the first-contact self-check's live items (spec_decode.runner.doctor)
    throughput_tok_s: Summary | None = None  # tok/s over the timed runs (record.sections)
    variance_components: VarianceComponents | None = None  # launches > 1: between vs within (record.sections)
    acceptance: Acceptance | None = None  # counters, per draft position, per request (record.sections)
    profile: Profile | None = None  # the phase profile, or why there is none (record.sections)
    decode_log: DecodeLog | None = None  # the engine's decode-log lines in the timed windows (record.sections)
    baseline: BaselineRef | None = None
    speedup_vs_baseline: Speedup | None = None  # its Ratio and how it was measured (record.sections)
    metrics: dict[str, float] = field(default_factory=dict)  # flat, units in the names (MLflow's)
    checks: list[Check] = field(default_factory=list)
    drift: Drift | None = None
    # Streamed timed runs: TTFT/ITL/TPOT/E2E percentiles (spec_decode.analysis.latency); None: none streamed
    latency: Latency | None = None
    requests: list[Request] = field(default_factory=list)  # the request pass, one per prompt (record.measured)
    categories: dict[str, Category] = field(default_factory=dict)  # the request pass per prompt category
    lossless: Lossless | None = None  # the lossless guard's verdict (spec_decode.analysis.lossless)
    mlflow_run_id: str | None = None
    load: LoadSection | None = None  # under load: the load section (record.load; analysis.load.finish)
    extra: dict[str, Any] = field(default_factory=dict)  # keys of other schema versions, kept as read

    # ---- reading --------------------------------------------------------------------------------
    @property
    def failed_checks(self) -> list[str]:
        return [c.name for c in self.checks if c.ok is False]

    @property
    def label(self) -> str:
        return self.name or "(defaults)"

    def choice(self, group: str) -> str | None:
        """The option chosen for a config group (``nccl`` -> ``tuned``)."""
        return (self.config.get(group) or {}).get("name")

    @property
    def steps(self) -> int | None:
        return (self.config.get("spec") or {}).get("steps") if self.speculative else None

    @property
    def forced_accept_len(self) -> float | None:
        """spec.simulate_accept_len as configured (the baseline arm keeps it too); None: real acceptance."""
        return (self.config.get("spec") or {}).get("simulate_accept_len")

    # ---- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "extra" or (v is None and f.name in NOT_WRITTEN_WHEN_NONE):
                continue
            if f.name in RUN_LISTS:
                v = [r.as_dict() for r in v]
            elif f.name in TYPED:
                v = _typed_json(f.name, v)
            elif f.name in LISTS and v is not None:
                v = [_typed_json(f.name, x, LISTS[f.name]) for x in v]
            elif f.name == "checks":
                v = [c.as_dict() for c in v]
            elif f.name == "categories":
                v = {name: c.as_dict() for name, c in v.items()}
            out[f.name] = v
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        """Read schema 1, 2 and 3 records (and keep unknown keys)."""
        d = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: d.pop(k) for k in list(d) if k in names and k != "extra"}
        run_fields = {f.name for f in dataclasses.fields(RunRecord)}
        for key in RUN_LISTS:
            known[key] = [RunRecord(**{k: v for k, v in r.items() if k in run_fields}) for r in known.get(key) or []]
        known["engine"] = EngineInfo(**(known.get("engine") or {"name": "unknown"}))
        for key, reader in READERS.items():
            known[key] = reader(known.get(key))
        known["checks"] = [
            Check(**{k: c.get(k) for k in ("name", "ok", "value", "expected", "message")})
            for c in known.get("checks") or []
        ]
        if known.get("drift"):
            dr = known["drift"]
            known["drift"] = Drift(**{f.name: dr.get(f.name) for f in dataclasses.fields(Drift)})
        if known.get("baseline"):
            b = known["baseline"]
            known["baseline"] = BaselineRef(
                b.get("out_dir"), b.get("mlflow_run_id"), summary_from(b.get("throughput_tok_s"))
            )
        if not known.get("record_id"):
            # schema 1 records got their id from MLflow; a stable one lets `tracking sync` find them again
            seed = f"{known.get('started_at')}:{known.get('config_hash')}:{known.get('name')}"
            known["record_id"] = hashlib.sha256(seed.encode()).hexdigest()[:16]
        for key in ("role", "name", "experiment", "config", "config_hash", "speculative"):
            known.setdefault(key, {"config": {}, "speculative": False}.get(key, ""))
        return cls(**known, extra=d)


# the typed sections' readers (results.json, schema 1 to 3): the JSON value (None where absent) -> typed
READERS = {
    "categories": categories_from,
    "lossless": lossless_from,
    "throughput_tok_s": summary_from,
    "variance_components": variance_components_from,
    "speedup_vs_baseline": speedup_from,
    "acceptance": acceptance_from,
    "latency": latency_from,
    "profile": profile_from,
    "launches": launches_from,
    "requests": requests_from,
    "profile_pass": profile_pass_from,
    "decode_log": decode_log_from,
    "provenance": provenance_from,
    "server_info": server_info_from,
    "nccl_probe": nccl_probe_from,
    "doctor": doctor_from,
    "load": load_from,
}


def _typed_json(name: str, v: Any, cls: type | None = None) -> Any:
    """A typed section's JSON (``TYPED``; an entry of a ``LISTS`` section, ``cls``); a value of another type
    is refused."""
    if v is None and cls is None:
        return {} if name in ABSENT_AS_EMPTY else None
    refuse(name, v, cls or TYPED[name])
    return v.as_dict() if hasattr(v, "as_dict") else dataclasses.asdict(v)


class WrittenTwice(RuntimeError):
    """A job wrote its record a second time: everything must be computed before the one write."""


def write(out_dir: Path, rec: JobRecord) -> Path:
    """The one write of a job's record (atomic; secret values of our environment scrubbed from the
    whole record). Refuses to overwrite this record's own earlier write (WrittenTwice); a record of
    another job in the same dir (a retried baseline) is replaced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    earlier = read(out_dir)
    if earlier is not None and earlier.record_id == rec.record_id:
        raise WrittenTwice(
            f"{path}: record {rec.record_id} is already written (status {earlier.status}); "
            "compute everything before results.write"
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(provenance.dumps_clean(rec.to_dict(), provenance.secret_values()) + "\n")
    os.replace(tmp, path)
    return path


def read(out_dir: Path) -> JobRecord | None:
    path = Path(out_dir) / FILENAME
    if not path.exists():
        return None
    try:
        return JobRecord.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError):
        return None


def collect(directory: Path) -> list[JobRecord]:
    """Every job's record under a directory, once, oldest first (``out_dir`` set to where it was found).
    A copy of a record (an MLflow artifact store inside the directory) counts once: the copy in the dir
    the job wrote it to wins."""
    found: dict[str, JobRecord] = {}
    for path in sorted(Path(directory).rglob(FILENAME)):
        try:
            rec = JobRecord.from_dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, TypeError):
            continue
        written_here = rec.out_dir == str(path.parent)
        rec.out_dir = str(path.parent)
        if rec.record_id not in found or written_here:
            found[rec.record_id] = rec
    return sorted(found.values(), key=lambda r: r.started_at)


def section(rec: JobRecord, name: str):
    """A record's issue-21 section (``latency``, ``categories``, ``lossless``, ``requests``) whether the
    record type declares it or it was read into ``extra`` (a record of another schema); None when
    absent or empty."""
    return getattr(rec, name, None) or rec.extra.get(name) or None


PERFORMANCE_ONLY = "performance-only: forced acceptance, outputs are not lossless"


def performance_only(rec: JobRecord) -> bool:
    """A speculative job run with forced acceptance (spec.simulate_accept_len): its speed numbers are
    real, its outputs and acceptance are not the drafter's. A baseline record that shares such a
    config (the job's baseline arm keeps spec.*) decodes plainly and is not performance-only -- unless
    its model is synthetic."""
    forced = rec.forced_accept_len
    synthetic = any((rec.config.get(group) or {}).get("synthetic") for group in ("model", "drafter"))
    # A synthetic (random-weight) target: its outputs mean nothing, whatever the arm (issue 31).
    return (forced is not None and bool(rec.speculative)) or synthetic
