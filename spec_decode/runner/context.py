"""The job's context: where a job writes, how it is named, where else it is logged. Built from Hydra's
runtime by ``hydra_entry`` (or by tests) and handed to ``runner.job.run_job``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from spec_decode.analysis.drift import Reference
from spec_decode.core.config import ExperimentConfig, config_hash, resolved_dict
from spec_decode.record import provenance
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.runner import provenance as collected

# The keys a sweep varies (views.sweep sets it for each job; hydra_entry reads it into JobContext.sweep_axes).
AXES_ENV = "SPEC_DECODE_SWEEP_AXES"
# When the sweep began (views.sweep sets it for each job): a reused sweep dir's older records are not its own.
STARTED_ENV = "SPEC_DECODE_SWEEP_STARTED"
WOULD_REFUSE = "would_refuse.txt"  # a dry-run job that preflight would stop: its errors, one a line (runner.dryrun)


class RunLog(Protocol):
    """Where a job's record is also logged (``views.tracking.Tracker``); the job calls it, never the reverse."""

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
    sweep_axes: list[str] = field(default_factory=list)  # the keys the sweep varies (nccl, spec.steps, ...)
    sweep_started: float = 0.0  # when the sweep began (time.time()); 0: unknown
    quiet: bool = False


def new_record(
    cfg: ExperimentConfig, ctx: JobContext, role: str, extra_env: dict[str, str], warnings: list[str]
) -> JobRecord:
    """The job's record as it starts (RUNNING): config, names, provenance."""
    conf = resolved_dict(cfg)
    return JobRecord(
        role=role,
        name=ctx.run_name,
        experiment=cfg.name,
        overrides=list(ctx.overrides),
        config=conf,
        config_hash=config_hash(conf),
        engine=EngineInfo(cfg.engine.name),
        speculative=cfg.speculative,
        server_env_extra=provenance.redact_env(extra_env),
        warnings=list(warnings),
        out_dir=str(ctx.out_dir),
        provenance=collected.collect(
            ctx.root,
            {
                "target": cfg.model.path,
                "drafter": cfg.drafter.path,
                "prompts": cfg.benchmark.prompts,
                "request_prompts": cfg.benchmark.request_prompts if cfg.benchmark.request_pass else None,
            },
        ),
    )
