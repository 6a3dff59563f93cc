"""results.json: the one authoritative record of a job (DESIGN §3.5), typed.

``JobRecord`` is built when a job starts (``new_record``), filled while it runs, completed by
``finish`` (aggregates, acceptance, phase profile, decode log, speedup, consistency checks) and by the
job's drift guard, then written once (``write``). MLflow (``tracking``), reports (``report``) and
DVC metrics (``experiment``) only read it: ``collect`` finds the records under a directory.

The JSON shape is that of schema 1 plus typed nesting; ``JobRecord.from_dict`` reads both (keys it
does not know are kept in ``extra`` and written back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from spec_decode.analysis import acceptance, drift, latency, lossless, profiler_effect, stats
from spec_decode.analysis.checks import Check, cost_model_metrics, run_checks
from spec_decode.analysis.drift import Drift, Reference
from spec_decode.core.config import ExperimentConfig, config_hash, resolved_dict
from spec_decode.parsers import decode_log, profile
from spec_decode.record import provenance
from spec_decode.runner import request_pass
from spec_decode.runner.client import RunRecord

# 2: typed record, drift and checks computed by the job, preflight failures recorded
# 3: streamed runs (latency), request pass (requests, categories), lossless guard, pairing, acceptance by
#    position and per request (absent sections read as empty: schema 1 and 2 records still load)
SCHEMA_VERSION = 3
FILENAME = "results.json"
STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")


class RunLog(Protocol):
    """Where a job's record is also logged (``tracking.Tracker``); the job calls it, never the reverse."""

    def start(self, rec: JobRecord, ctx: JobContext) -> str | None: ...

    def earlier_baselines(self, rec: JobRecord) -> list[Reference] | None: ...

    def finish(self, run_id: str | None, rec: JobRecord, out_dir: Path) -> None: ...

    def ui_command(self) -> str: ...

    def ui_url(self, run_id: str | None = None) -> str: ...


@dataclass
class JobContext:
    """Where a job writes and how it is named; built from Hydra's runtime by cli.py (or by tests)."""

    out_dir: Path
    run_name: str
    root: Path = field(default_factory=Path.cwd)  # project root: relative paths resolve here
    sweep_dir: Path | None = None  # set in a multirun: baselines are shared across its jobs
    parent_run_id: str | None = None
    overrides: list[str] = field(default_factory=list)
    tracker: RunLog | None = None  # MLflow, or None for no MLflow
    quiet: bool = False


@dataclass
class EngineInfo:
    name: str
    version: str | None = None


@dataclass
class BaselineRef:
    """The baseline a spec job's speedup is measured against."""

    out_dir: str | None
    mlflow_run_id: str | None
    throughput_tok_s: dict | None  # its stats.Summary


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
    overrides: list[str] = field(default_factory=list)
    record_id: str = field(default_factory=lambda: os.urandom(8).hex())
    server_env_extra: dict[str, str] = field(default_factory=dict)  # what we add (redacted)
    server_env: dict[str, str] | None = None  # read back from the live server process (filtered)
    server_env_processes: dict[str, dict[str, str]] | None = None  # every server process (TP ranks), by pid
    server_env_set_by_engine: dict[str, str] = field(default_factory=dict)  # written by its launcher for the ranks
    argv: list[str] | None = None
    slots: list[str] | None = None
    launches: list[dict] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    # Paired baseline (benchmark.paired): the baseline server's timed runs, interleaved with ``runs``
    # (pair i = runs[i], baseline_runs[i]).
    baseline_runs: list[RunRecord] = field(default_factory=list)
    # The profiled pass (benchmark.profile; spec_decode/runner/profile_pass.py): after the timed runs,
    # which ran with the hooks dormant, the profiler-on runs of its (on, dormant) pairs -- the profile's
    # windows -- and the pass's account with the profiler's measured effect on tok/s.
    profiled_runs: list[RunRecord] = field(default_factory=list)
    profile_pass: dict | None = None
    warnings: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    out_dir: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    server_info: dict | None = None
    nccl_probe: dict | None = None
    doctor: list[dict] | None = None  # the first-contact self-check's live items (spec_decode.runner.doctor)
    throughput_tok_s: dict | None = None  # stats.Summary of the runs
    variance_components: dict | None = None
    acceptance: dict | None = None
    profile: dict | None = None
    decode_log: dict | None = None
    baseline: BaselineRef | None = None
    speedup_vs_baseline: dict | None = None  # stats.Ratio
    metrics: dict[str, float] = field(default_factory=dict)  # flat, units in the names (MLflow's)
    checks: list[Check] = field(default_factory=list)
    drift: Drift | None = None
    # Streamed timed runs: {ttft_ms|itl_ms|tpot_ms|e2e_ms: {p50, p90, p99, mean, n}} (spec_decode.analysis.latency)
    latency: dict = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)  # the request pass, one entry per prompt
    categories: dict = field(default_factory=dict)  # the request pass per prompt category
    lossless: dict = field(default_factory=dict)  # the lossless guard's verdict (spec_decode.analysis.lossless)
    mlflow_run_id: str | None = None
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

    # ---- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if f.name in ("runs", "baseline_runs", "profiled_runs"):
                v = [r.as_dict() for r in v]
            elif dataclasses.is_dataclass(v):
                v = dataclasses.asdict(v)
            elif f.name == "checks":
                v = [c.as_dict() for c in v]
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
        for key in ("runs", "baseline_runs", "profiled_runs"):
            known[key] = [RunRecord(**{k: v for k, v in r.items() if k in run_fields})
                          for r in known.get(key) or []]
        known["engine"] = EngineInfo(**(known.get("engine") or {"name": "unknown"}))
        known["checks"] = [Check(**{k: c.get(k) for k in ("name", "ok", "value", "expected", "message")})
                           for c in known.get("checks") or []]
        if known.get("drift"):
            dr = known["drift"]
            known["drift"] = Drift(**{f.name: dr.get(f.name) for f in dataclasses.fields(Drift)})
        if known.get("baseline"):
            b = known["baseline"]
            known["baseline"] = BaselineRef(b.get("out_dir"), b.get("mlflow_run_id"), b.get("throughput_tok_s"))
        if not known.get("record_id"):
            # schema 1 records got their id from MLflow; a stable one lets `tracking sync` find them again
            seed = f"{known.get('started_at')}:{known.get('config_hash')}:{known.get('name')}"
            known["record_id"] = hashlib.sha256(seed.encode()).hexdigest()[:16]
        for key in ("role", "name", "experiment", "config", "config_hash", "speculative"):
            known.setdefault(key, {"config": {}, "speculative": False}.get(key, ""))
        return cls(**known, extra=d)


def new_record(cfg: ExperimentConfig, ctx: JobContext, role: str, extra_env: dict[str, str],
               warnings: list[str]) -> JobRecord:
    conf = resolved_dict(cfg)
    return JobRecord(
        role=role, name=ctx.run_name, experiment=cfg.name, overrides=list(ctx.overrides), config=conf,
        config_hash=config_hash(conf), engine=EngineInfo(cfg.engine.name), speculative=cfg.speculative,
        server_env_extra=provenance.redact_env(extra_env), warnings=list(warnings), out_dir=str(ctx.out_dir),
        provenance=provenance.collect(ctx.root, {
            "target": cfg.model.path, "drafter": cfg.drafter.path, "prompts": cfg.benchmark.prompts,
            "request_prompts": cfg.benchmark.request_prompts if cfg.benchmark.request_pass else None,
        }),
    )


def finish(rec: JobRecord, cfg: ExperimentConfig, status: str, error: str | None, out_dir: Path,
           log_path: Path, log_windows: list[tuple[int, int]], baseline: JobRecord | None,
           live_env: dict[str, str] | None = None, live_env_tree: dict | None = None) -> None:
    """Everything computed from what was measured: aggregates, acceptance, profile, decode log,
    speedup, cost-model figures, consistency checks. Writes nothing.

    ``live_env``: the server's environment read back from its process; ``live_env_tree``: that of
    every process of the server (pid -> env)."""
    rec.status, rec.error = status, error
    rec.ended_at = time.time()
    rec.server_env = provenance.filter_env(live_env) if live_env else None
    if live_env_tree:
        # Every process of the server read back. The ranks (the launcher's children) are what ran:
        # the launcher's own /proc environ misses what it wrote into os.environ before spawning them.
        rec.server_env_processes = {str(pid): provenance.filter_env(env) for pid, env in live_env_tree.items()}
        ranks = provenance.rank_environment(live_env_tree, rec.launches[0]["pid"] if rec.launches else None)
        rec.server_env, rec.server_env_set_by_engine = ranks["env"], ranks["set_by_engine"]
        nccl = {k: v for k, v in ranks["differing"].items() if k.startswith("NCCL_")}
        if nccl:
            rec.warnings.append(f"the server's rank processes do not share one NCCL environment: {nccl}")
        for k, v in cfg.nccl.env.items():
            if ranks["env"].get(k) != str(v):
                rec.warnings.append(f"nccl={cfg.nccl.name} sets {k}={v} but the server's ranks ran with "
                                    f"{k}={ranks['env'].get(k)} (the engine's launcher rewrote it: "
                                    "server_env_set_by_engine)")
    rec.engine.version = (rec.server_info or {}).get("version")
    runs = rec.runs
    metrics: dict[str, float] = {}
    if runs:
        s = stats.summarize([r.throughput_tok_s for r in runs])
        rec.throughput_tok_s = s.as_dict()
        metrics["throughput_tok_s"] = s.mean
        for k in ("median", "std", "cv", "robust_cv", "ci95_lo", "ci95_hi"):
            metrics[f"throughput_tok_s_{k}"] = getattr(s, k)
        metrics["mde_pct"] = 100 * stats.min_detectable_effect(s.cv, s.n)
        if s.cv > stats.CV_WARN:
            rec.warnings.append(
                f"run-to-run CV {100 * s.cv:.1f}% > {100 * stats.CV_WARN:.0f}%: differences below "
                f"~{metrics['mde_pct']:.1f}% are not detectable with {s.n} runs"
            )
        if cfg.benchmark.launches > 1:
            groups = [[r.throughput_tok_s for r in runs if r.launch == i] for i in range(cfg.benchmark.launches)]
            rec.variance_components = stats.variance_components(groups)
    starts = [x["server_start_s"] for x in rec.launches if x.get("server_start_s") is not None]
    if starts:
        metrics["server_start_s"] = sum(starts) / len(starts)
    if cfg.speculative and runs:
        def total(key: str) -> int | None:
            vals = [getattr(r, key) for r in runs]
            return None if vals[0] is None else sum(v or 0 for v in vals)

        acc = stats.acceptance(sum(r.completion_tokens for r in runs), total("spec_verify_ct") or 0,
                               total("spec_num_correct_drafts"), total("spec_num_proposed_drafts"),
                               cfg.spec.num_draft_tokens or 0)
        rec.acceptance = {**acc, "accept_len_source": "meta_info counters (run-scoped)",
                          "per_run_accept_len": [r.completion_tokens / r.spec_verify_ct
                                                 for r in runs if r.spec_verify_ct]}
        metrics.update({k: v for k, v in acc.items() if v is not None})
    # Phase profile inside the profiled pass's windows (older records: the timed runs'): the logging
    # rank's, the others compared with it; with the profiler's measured effect on tok/s beside it.
    run_cycles: list[list[dict]] | None = None
    prof_runs = rec.profiled_runs or runs
    where = "profiled pass" if rec.profiled_runs else "timed runs"
    if rec.profile_pass is not None:
        rec.profile_pass["effect"] = profiler_effect.effect(
            [r.throughput_tok_s for r in rec.profiled_runs], rec.profile_pass.get("dormant_tok_s") or [],
            [r.throughput_tok_s for r in runs])
        metrics.update(profiler_effect.metrics_of(rec.profile_pass["effect"]))
    if cfg.speculative:
        windows = [(r.start_wall, r.end_wall) for r in prof_runs]
        summary, per_run = profile.summarize_run_windows(out_dir / "profile.jsonl", windows,
                                                         requests=[(r.rid, r.spec_verify_ct) for r in prof_runs])
        run_cycles = per_run
        if summary is None:
            why = "profiling off (benchmark.profile=false)" if not cfg.benchmark.profile else \
                f"no profile lines from rank 0 in the {where} (plugin not loaded?)"
            rec.profile = {"missing": why}
            if cfg.benchmark.profile and runs:
                rec.warnings.append(f"phase profile missing: {why}")
        else:
            # Per request: tok/s inside the decode on the wall clock vs from the cycle durations, and
            # the time outside the cycles (prefill, HTTP, gaps between cycles) as its own figure.
            timing = [profile.run_timing(w, r.start_wall, r.end_wall, r.wall_s) for r, w in zip(prof_runs, per_run)]
            summary["per_run"] = timing
            have = [t for t in timing if t is not None]
            summary["non_cycle_ms_per_request"] = (sum(t["non_cycle_ms"] for t in have) / len(have)
                                                   if have else None)
            if have:
                wall_ms = sum(t["wall_ms"] for t in have)
                metrics["non_cycle_ms"] = summary["non_cycle_ms_per_request"]
                metrics["non_cycle_pct"] = 100 * sum(t["non_cycle_ms"] for t in have) / wall_ms
                for part in ("head", "gap", "tail"):
                    metrics[f"non_cycle_{part}_ms"] = sum(t[f"{part}_ms"] for t in have) / len(have)
            # Every verify is one cycle: a complete profile has exactly the runs' verify count.
            verify_ct = sum(r.spec_verify_ct or 0 for r in prof_runs)
            summary["spec_verify_ct"] = verify_ct
            summary["measured_in"] = ("the profiled pass (profiler on; the timed runs ran it dormant)"
                                      if rec.profiled_runs else "the timed runs (profiler on)")
            summary["measured_in_tok_s"] = stats.summarize([r.throughput_tok_s for r in prof_runs]).mean
            summary["complete"] = summary["cycles"] == verify_ct
            if not summary["complete"]:
                rec.warnings.append(
                    f"phase profile incomplete: {summary['cycles']} cycles from rank 0 in the {where}, "
                    f"but the runs' meta_info says {verify_ct} verifies")
            agreement = summary.get("rank_agreement")
            if agreement and not agreement["ok"]:
                rec.warnings.append(
                    f"phase profiles of the {summary['ranks']} ranks disagree (cycle counts differ or "
                    f"a rank's mean cycle is more than {agreement['tolerance_pct']:.0f}% from rank 0's): "
                    + ", ".join(f"rank {r}: {a['cycles']} cycles, {a['cycle_ms_diff_pct']:+.1f}%"
                                for r, a in agreement["ranks"].items()))
            if cfg.engine.name == "sglang" and "--disable-overlap-schedule" not in cfg.engine.extra_args:
                summary["host_stamps_na"] = ("SGLang's overlap scheduler: a cycle's host stamps span its enqueue, "
                                             "not its GPU work (scheduler.py 2107-2120); no GPU timeline yet")
            elif (cfg.engine.name == "embedded" and cfg.hardware.device == "cuda"
                  and not getattr(cfg.engine, "disable_overlap_schedule", True)):
                summary["host_stamps_na"] = ("the embedded engine's overlap loop on CUDA: a cycle's host stamps "
                                             "span its launch, not its GPU work (cycle_ms: CUDA events)")
            rec.profile = summary
            for k in ("cycle_ms", "draft_ms", "verify_ms", "extend_ms", "other_ms",
                      "draft_pct", "verify_pct", "extend_pct", "other_pct"):
                metrics[k] = summary[k]
    # Per-request and per-position acceptance: from the profile's cycles where it has them, else from
    # the requests' meta_info histograms (spec_decode.analysis.acceptance).
    if cfg.speculative and runs:
        per_request = acceptance.summarize(cfg.spec.steps, prof_runs if run_cycles else runs, run_cycles,
                                           getattr(rec, "requests", None) or None)
        if per_request is not None:
            rec.acceptance = {**(rec.acceptance or {}), **per_request}
            metrics.update(acceptance.metrics_of(per_request))
            if per_request.get("profile_matches_meta_info") is False:
                rec.warnings.append("acceptance histogram: the profile's cycles and the runs' meta_info "
                                    "spec_correct_drafts_histogram disagree (the profile's is used)")
    # Decode-log summary inside the timed windows.
    lines: list[str] = []
    if log_path.exists():
        with open(log_path, "rb") as f:
            for lo, hi in log_windows:
                f.seek(lo)
                lines += f.read(hi - lo).decode(errors="replace").splitlines()
    dl = decode_log.summarize(decode_log.parse_lines(lines))
    rec.decode_log = dl.__dict__
    if dl.gen_throughput_tok_s_median is not None:
        metrics["decode_log_gen_throughput_tok_s"] = dl.gen_throughput_tok_s_median
    # Speedup against the matching baseline: per pair when its runs were interleaved with ours
    # (benchmark.paired), else the ratio of two independent means (Welch CI).
    if rec.baseline_runs and runs:
        n = min(len(runs), len(rec.baseline_runs))
        spec_tput = [r.throughput_tok_s for r in runs[:n]]
        base_tput = [r.throughput_tok_s for r in rec.baseline_runs[:n]]
        ratio = stats.paired_ratio(spec_tput, base_tput)
        base_summary = stats.summarize(base_tput).as_dict()
        rec.baseline = BaselineRef(baseline.out_dir if baseline else None,
                                   baseline.mlflow_run_id if baseline else None, base_summary)
        # which pairing produced the CI: as the launches ran it (spec_decode/runner/pairing.py)
        pairing = sorted({x.get("pairing", "interleaved") for x in rec.launches if "baseline_pid" in x})
        rec.speedup_vs_baseline = {**ratio.as_dict(), "method": "paired", "pairs": n,
                                   "pairing": ",".join(pairing) or "interleaved",
                                   "per_pair": [x / y for x, y in zip(spec_tput, base_tput)]}
        if baseline is not None and baseline.runs:
            # The unpaired figure against the sweep's separate baseline job, for comparison.
            rec.speedup_vs_baseline["vs_baseline_job"] = stats.ratio_of_means(
                [r.throughput_tok_s for r in runs], [r.throughput_tok_s for r in baseline.runs]).as_dict()
        metrics["baseline_throughput_tok_s"] = base_summary["mean"]
    elif baseline is not None and runs and baseline.runs:
        ratio = stats.ratio_of_means([r.throughput_tok_s for r in runs], [r.throughput_tok_s for r in baseline.runs])
        rec.baseline = BaselineRef(baseline.out_dir, baseline.mlflow_run_id, baseline.throughput_tok_s)
        rec.speedup_vs_baseline = {**ratio.as_dict(), "method": "welch"}
        metrics["baseline_throughput_tok_s"] = (baseline.throughput_tok_s or {})["mean"]
    else:
        ratio = None
    if ratio is not None:
        metrics["speedup_vs_baseline"] = ratio.ratio
        metrics["speedup_vs_baseline_ci95_lo"] = ratio.ci95_lo
        metrics["speedup_vs_baseline_ci95_hi"] = ratio.ci95_hi
        metrics["speedup_ci95_halfwidth_pct"] = 100 * (ratio.ci95_hi - ratio.ci95_lo) / 2 / ratio.ratio
    if rec.nccl_probe:
        from spec_decode.probe.nccl import metrics_of

        metrics.update(metrics_of(rec.nccl_probe))
        rec.provenance["nccl"] = {k: rec.nccl_probe.get(k) for k in
                                  ("backend", "nccl_version", "algorithms", "protocols")}
    metrics.update(cost_model_metrics(metrics))
    rec.latency = latency.summarize(runs)
    metrics.update(latency.metrics_of(rec.latency))
    rec.categories = request_pass.categories(rec.requests)
    metrics.update(request_pass.metrics_of(rec.categories))
    rec.lossless = guard_lossless(rec, cfg, out_dir, baseline)
    if rec.lossless["checked"]:
        metrics["lossless_match_rate"] = rec.lossless["match_rate"]
    rec.metrics = {k: float(v) for k, v in metrics.items() if v is not None}
    rec.checks = run_checks(rec.metrics, [r.as_dict() for r in runs], rec.profile, rec.speculative,
                            cfg.spec.steps if cfg.speculative else 0, [r.as_dict() for r in prof_runs])
    if (check := lossless.check_of(rec.lossless)) is not None:
        rec.checks.append(check)
    elif rec.lossless["verdict"] == "warn":
        rec.warnings.append(f"lossless guard: {rec.lossless['reason']}")


def guard_lossless(rec: JobRecord, cfg: ExperimentConfig, out_dir: Path, baseline: JobRecord | None) -> dict:
    """The spec job's outputs against the baseline's for the same prompts (``spec_decode.analysis.lossless``):
    the timed runs against the paired baseline's runs (else the baseline job's), the request pass
    against the baseline job's request pass (its ``outputs.jsonl``)."""
    if rec.role != "spec":
        return lossless.skipped("a baseline job (no speculation to check)")
    b = cfg.benchmark
    base_runs = rec.baseline_runs or (baseline.runs if baseline is not None else [])
    base_ids = next((r.output_ids for r in base_runs if r.output_ids is not None), None)
    comparisons = [lossless.Comparison(f"timed:{b.prompt_index}", r.output_ids, base_ids, b.max_new_tokens)
                   for r in rec.runs]
    if rec.requests:
        mine = request_pass.read_outputs(out_dir)
        theirs = request_pass.read_outputs(baseline.out_dir if baseline is not None else None)
        comparisons += [lossless.Comparison(str(e["prompt_index"]), mine.get(e["prompt_index"]),
                                            theirs.get(e["prompt_index"]), b.request_max_new_tokens)
                        for e in rec.requests]
    return lossless.guard(comparisons, rec.engine.name, b.temperature, performance_only(rec),
                          has_baseline=bool(base_runs) or baseline is not None)


def add_drift(rec: JobRecord, earlier: list[Reference]) -> None:
    """The drift guard's finding for a finished baseline (a warning when it found something)."""
    if rec.role != "baseline" or rec.status != "FINISHED" or "throughput_tok_s" not in rec.metrics:
        return
    rec.drift = drift.check(rec.metrics["throughput_tok_s"], rec.server_env or {}, earlier,
                            drift.data_hashes_of(rec.provenance), rec.engine.version)
    if rec.drift is not None and rec.drift.message:
        rec.warnings.append(rec.drift.message)


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
        raise WrittenTwice(f"{path}: record {rec.record_id} is already written (status {earlier.status}); "
                           "compute everything before results.write")
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
    forced = (rec.config.get("spec") or {}).get("simulate_accept_len")
    synthetic = any((rec.config.get(group) or {}).get("synthetic") for group in ("model", "drafter"))
    # A synthetic (random-weight) target: its outputs mean nothing, whatever the arm (issue 31).
    return (forced is not None and bool(rec.speculative)) or synthetic


def job_summary(rec: JobRecord) -> str:
    """A few console lines for one finished job."""
    m = rec.metrics
    label = f", {PERFORMANCE_ONLY} (accept len forced to {rec.config['spec']['simulate_accept_len']})" \
        if performance_only(rec) else ""
    lines = [f"[{rec.status}] {rec.label} ({rec.role}, engine={rec.engine.name}{label})"]
    if rec.error:
        lines.append(f"  error: {rec.error}")
    if "throughput_tok_s" in m:
        lines.append(
            f"  throughput {m['throughput_tok_s']:.1f} tok/s  95% CI [{m['throughput_tok_s_ci95_lo']:.1f}, "
            f"{m['throughput_tok_s_ci95_hi']:.1f}]  CV {100 * m['throughput_tok_s_cv']:.1f}%  "
            f"({len(rec.runs)} runs)"
        )
    if "accept_len" in m:
        lines.append(f"  accept len {m['accept_len']:.2f}  draft accept rate {m.get('accept_rate_draft', float('nan')):.2f}")
    acc = rec.acceptance or {}
    if acc.get("per_position"):
        lines.append("  acceptance by draft position " + " ".join("-" if r is None else f"{r:.2f}" for r in acc["per_position"])
                     + f" ({acc.get('source')})" + ("" if acc.get("accept_len_weighted") is None else
                     f"; accept len per request: {acc['accept_len_weighted']:.2f} weighted by verifies, "
                     f"{acc['accept_len_unweighted']:.2f} unweighted"))
    if "cycle_ms" in m:
        lines.append(
            f"  cycle {m['cycle_ms']:.2f} ms = draft {m['draft_ms']:.2f} ({m['draft_pct']:.0f}%) + verify "
            f"{m['verify_ms']:.2f} ({m['verify_pct']:.0f}%) + re-extend {m['extend_ms']:.2f} "
            f"({m['extend_pct']:.0f}%) + other {m['other_ms']:.2f} ({m['other_pct']:.0f}%)"
        )
    if "speedup_vs_baseline" in m:
        method = (rec.speedup_vs_baseline or {}).get("method", "welch")
        sp = rec.speedup_vs_baseline or {}
        how = (f"paired: {sp.get('pairs')} {sp.get('pairing', 'interleaved')} pairs, baseline "
               f"{m['baseline_throughput_tok_s']:.1f} tok/s" if method == "paired" else "vs a separate baseline job")
        lines.append(
            f"  speedup vs baseline {m['speedup_vs_baseline']:.3f}x  95% CI "
            f"[{m['speedup_vs_baseline_ci95_lo']:.3f}, {m['speedup_vs_baseline_ci95_hi']:.3f}] "
            f"(+-{m['speedup_ci95_halfwidth_pct']:.1f}%; {how})"
        )
    lines += latency.describe(rec.latency or {})  # streamed runs only
    for c in rec.checks:
        if c.ok is False:
            lines.append(f"  CHECK FAILED {c.name}: {c.message}")
    for w in rec.warnings:
        lines.append(f"  warning: {w}")
    if rec.drift is not None and rec.drift.note and not rec.drift.message:
        lines.append(f"  drift guard: {rec.drift.note}")
    lines.append(f"  -> {rec.out_dir}/{FILENAME}")
    return "\n".join(lines)
