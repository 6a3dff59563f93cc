"""The record's finish: every derived section, computed from what a job measured, in order (``finish``),
and the drift guard's finding for a job that measured a baseline (``add_drift``). The runner calls them
(``runner.job.measure``) and then writes the record once (``record.results.write``); nothing here
measures, launches or writes.

Each section is a pure function (``analysis.sections`` and the modules it names) returning a ``Section``;
``finish`` takes them in turn (later ones read earlier metrics). What the job's engine decides (exact
outputs or not, the host-stamp rule of its profile) comes in as ``engine``: analysis does not import the
engines (they import analysis). Who computes each section: the table in docs/architecture.md.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from spec_decode.analysis import categories, drift, host, lossless, sections
from spec_decode.analysis.checks import cost_model_metrics, host_oversubscribed, run_checks
from spec_decode.analysis.drift import Reference
from spec_decode.analysis.sections import Section
from spec_decode.core.config import BenchmarkConfig, ExperimentConfig, NcclConfig
from spec_decode.core.groups import HardwareConfig
from spec_decode.parsers import decode_log
from spec_decode.record import outputs
from spec_decode.record.measured import Launch
from spec_decode.record.results import BaselineRef, JobRecord, performance_only


class EngineFacts(Protocol):
    """What ``finish`` asks of the job's engine (``engines.engine.Engine`` answers it)."""

    exact_outputs: bool

    def host_stamps_na(self, cfg: ExperimentConfig) -> str | None: ...

    def nccl_inert(self, hardware: HardwareConfig) -> str | None: ...


@dataclass
class Measured:
    """What a job's launches leave besides the record's runs: the server log and the byte windows of
    the timed runs in it, and the first launch's server environment read back (its whole tree too)."""

    out_dir: Path
    log_path: Path
    log_windows: list[tuple[int, int]] = field(default_factory=list)
    live_env: dict[str, str] = field(default_factory=dict)
    live_env_tree: dict = field(default_factory=dict)


def finish(
    rec: JobRecord,
    cfg: ExperimentConfig,
    status: str,
    error: str | None,
    measured: Measured,
    baseline: JobRecord | None,
    engine: EngineFacts,
) -> None:
    """Every section computed from what was measured, in order (later ones read earlier metrics). Writes nothing."""
    rec.status, rec.error, rec.ended_at = status, error, time.time()
    metrics: dict[str, float] = {}
    take = functools.partial(_take, rec, metrics)
    take(_server_env_section(rec, cfg.nccl, measured))
    rec.engine.version = (rec.server_info.version or None) if rec.server_info else None
    rec.engine.nccl_inert = engine.nccl_inert(cfg.hardware)  # the A/A pairs of analysis.control
    take(sections.throughput(rec.runs, cfg.benchmark.launches))
    take(sections.server_start(rec.launches))
    if cfg.speculative and rec.runs:
        take(sections.acceptance_counters(rec.runs, cfg.spec.num_draft_tokens or 0))
    take(sections.profiler_cost(rec.profile_pass, rec.profiled_runs, rec.runs))
    if cfg.speculative:
        _profile_and_request_acceptance(
            rec, cfg.spec.steps, cfg.benchmark.profile, measured, engine.host_stamps_na(cfg), take
        )
    take(sections.decode_log_summary(decode_log.read_windows(measured.log_path, measured.log_windows)))
    _speedup(rec, baseline, take)
    take(sections.nccl_section(rec.nccl_probe, rec.provenance))
    take(Section(metrics=cost_model_metrics(metrics)))
    take(sections.latency_percentiles(rec.runs))
    take(categories.section(rec.requests))
    take(lossless_section(rec, cfg.benchmark, measured.out_dir, baseline, engine.exact_outputs))
    take(Section(metrics=host.metrics_of([x.host for x in rec.launches if x.host is not None])))
    take(Section(metrics=host.server_cpu(rec.launches, rec.runs, rec.baseline_runs)))
    if baseline is not None:  # the baseline job's servers (benchmark.paired=false): as a paired baseline's
        take(Section(metrics=host.as_baseline(baseline.metrics)))
    rec.metrics = {k: float(v) for k, v in metrics.items() if v is not None}
    _checks(rec, cfg.spec.steps if cfg.speculative else 0, cfg.benchmark.stream)


def _server_env_section(rec: JobRecord, nccl: NcclConfig, measured: Measured) -> Section:
    """The first launch's server environment read back, against the NCCL profile's (record.provenance)."""
    pid = rec.launches[0].pid if rec.launches else None
    return sections.server_env_section(measured.live_env, measured.live_env_tree, pid, nccl.name, nccl.env)


def _profile_and_request_acceptance(
    rec: JobRecord, steps: int, profile_on: bool, measured: Measured, host_stamps_na: str | None, take
) -> None:
    """The phase profile, then the acceptance per request (from the profiled cycles where there are any)."""
    run_cycles = _phase_profile(rec, profile_on, measured.out_dir / "profile.jsonl", host_stamps_na, take)
    if rec.runs:
        runs = _profile_windows(rec) if run_cycles else rec.runs
        take(sections.request_acceptance(steps, runs, run_cycles, rec.requests, rec.acceptance))


def _speedup(rec: JobRecord, baseline: JobRecord | None, take) -> None:
    """The speedup over the paired baseline runs, else the baseline job's; where there is one, the record
    points at the baseline it used."""
    sp, base_summary = sections.speedup(
        rec.runs,
        rec.baseline_runs,
        _pairings(rec.launches),
        baseline.runs if baseline is not None else None,
        baseline.throughput_tok_s if baseline is not None else None,
    )
    if take(sp).fields:
        rec.baseline = BaselineRef(baseline and baseline.out_dir, baseline and baseline.mlflow_run_id, base_summary)


def _checks(rec: JobRecord, steps: int, stream: bool) -> None:
    """The checks over the finished metrics and runs, then the lossless guard's verdict (a check, or a warning)."""
    rec.checks = run_checks(
        rec.metrics,
        [r.as_dict() for r in rec.runs],
        rec.profile,
        rec.speculative,
        steps,
        [r.as_dict() for r in _profile_windows(rec)],
        host_oversubscribed(rec.metrics.get("host_load1"), (rec.provenance.host or {}).get("usable_cores")),
        stream,
    )
    if (check := lossless.check_of(rec.lossless)) is not None:
        rec.checks.append(check)
    elif rec.lossless is not None and rec.lossless.verdict == "warn":
        rec.warnings.append(f"lossless guard: {rec.lossless.reason}")


def _phase_profile(
    rec: JobRecord, profile_on: bool, path: Path, host_stamps_na: str | None, take
) -> list[list[dict]] | None:
    """The phase profile section (``analysis.sections.phase_profile``); returns each profiled run's cycles."""
    section, run_cycles = sections.phase_profile(
        path,
        _profile_windows(rec),
        not rec.profiled_runs,
        profile_on,
        bool(rec.runs),
        host_stamps_na,
    )
    take(section)
    return run_cycles


def _profile_windows(rec: JobRecord) -> list:
    """The runs whose windows hold the profile: each profiled request (under load, the profiled pass's
    requests), else the profiled runs, else (older protocol) the timed runs."""
    return rec.profiled_requests or rec.profiled_runs or rec.runs


def _take(rec: JobRecord, metrics: dict[str, float], section: Section) -> Section:
    """A section into the record: its fields set, its metrics and warnings appended (in order)."""
    for name, value in section.fields.items():
        setattr(rec, name, value)
    metrics.update(section.metrics)
    rec.warnings.extend(section.warnings)
    return section


def _pairings(launches: list[Launch]) -> list[str]:
    """Which pairing produced the paired CI, as the launches ran it (spec_decode/runner/pairing.py)."""
    return sorted({x.pairing or "interleaved" for x in launches if x.baseline_pid is not None})


def lossless_section(
    rec: JobRecord, b: BenchmarkConfig, out_dir: Path, baseline: JobRecord | None, exact: bool
) -> Section:
    """The spec job's outputs against the baseline's for the same prompts (``spec_decode.analysis.lossless``):
    the timed runs against the paired baseline's runs (else the baseline job's), the request pass
    against the baseline's request pass (the baseline job's ``outputs.jsonl``, else the paired server's)."""
    if rec.role != "spec":
        return Section({"lossless": lossless.skipped("a baseline job (no speculation to check)")})
    base_runs = rec.baseline_runs or (baseline.runs if baseline is not None else [])
    base_ids = next((r.output_ids for r in base_runs if r.output_ids is not None), None)
    comparisons = [
        lossless.Comparison(f"timed:{b.prompt_index}", r.output_ids, base_ids, b.max_new_tokens) for r in rec.runs
    ]
    if rec.requests:
        mine = outputs.read(out_dir)
        theirs = (
            outputs.read(baseline.out_dir) if baseline is not None else outputs.read(out_dir, outputs.PAIRED_FILE)
        )  # the paired server's
        comparisons += [
            lossless.Comparison(
                str(e.prompt_index), mine.get(e.prompt_index), theirs.get(e.prompt_index), b.request_max_new_tokens
            )
            for e in rec.requests
        ]
    verdict = lossless.guard(
        comparisons,
        exact,
        b.temperature,
        performance_only(rec),
        has_baseline=bool(base_runs) or baseline is not None,
    )
    return Section({"lossless": verdict}, {"lossless_match_rate": verdict.match_rate} if verdict.checked else {})


def measures_baseline(rec: JobRecord) -> str | None:
    """The metric holding the baseline a finished job measured, if it measured one: a baseline job's
    ``throughput_tok_s``, a paired spec job's baseline arm (``baseline_throughput_tok_s``)."""
    if rec.status != "FINISHED":
        return None
    key = "throughput_tok_s" if rec.role == "baseline" else "baseline_throughput_tok_s" if rec.baseline_runs else None
    return key if key in rec.metrics else None


def add_drift(rec: JobRecord, earlier: list[Reference]) -> None:
    """The drift guard's finding for a job that measured a baseline (a baseline job, or a paired spec job's
    baseline arm beside it): a warning when it found something."""
    if (key := measures_baseline(rec)) is None:
        return
    rec.drift = drift.check(
        rec.metrics[key],
        rec.server_env or {},
        earlier,
        drift.data_hashes_of(rec.provenance),
        rec.engine.version,
        rec.choice("nccl"),
        paired=key != "throughput_tok_s",
    )
    if rec.drift is not None and rec.drift.message:
        rec.warnings.append(rec.drift.message)
