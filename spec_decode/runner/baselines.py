"""The baseline a spec job is measured against, and the earlier ones its drift guard compares with: the
baseline arm's config (the drafter off, spec.* kept), its job name and sharing key (the strategy
``baseline_strategy=job``: one baseline job per key in a sweep), and the earlier baselines of the same
identity (MLflow when reachable, else results.json under tracking.results_dirs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spec_decode.analysis import drift
from spec_decode.analysis.finish import measures_baseline
from spec_decode.core.config import DrafterConfig, ExperimentConfig, config_hash, resolved_dict
from spec_decode.core.identity import SPEC_ITEM, override_items
from spec_decode.record import results
from spec_decode.record.results import JobRecord
from spec_decode.runner.context import JobContext


def baseline_config(cfg: ExperimentConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, drafter=DrafterConfig(name="none", path=None, layer_ids=None))


def baseline_name(run_name: str) -> str:
    """The baseline's job name: ``baseline`` plus the spec job's overrides that are not about
    speculation (``nccl=tuned,spec.steps=2`` -> ``baseline,nccl=tuned``). Unique per baseline in a
    sweep, stable across reruns: experiments key their metrics by it."""
    keep = [item for item in override_items(run_name) if not SPEC_ITEM.match(item)]
    return ",".join(["baseline", *keep])


def baseline_key(cfg: ExperimentConfig) -> str:
    """Jobs that share hardware, model, NCCL profile, engine and benchmark share one baseline."""
    data = resolved_dict(baseline_config(cfg))
    data.pop("spec", None)
    data.pop("name", None)
    data.pop("tracking", None)
    readable = f"hardware={cfg.hardware.name},model={cfg.model.name},nccl={cfg.nccl.name},engine={cfg.engine.name}"
    return f"{readable},{config_hash(data)[:8]}"


def earlier_baselines(results_dirs: list[str], nccl: str, ctx: JobContext, rec: JobRecord) -> list[drift.Reference]:
    """The drift guard's reference: earlier baselines (baseline jobs and paired jobs' baseline arms) of the
    same identity, any NCCL profile, from MLflow when tracking is on and reachable, else from the
    results.json files under ``results_dirs`` (tracking.results_dirs). A sweep that varies NCCL compares each profile with
    its own history: there another profile is the question asked, not drift."""
    found = ctx.tracker.earlier_baselines(rec) if ctx.tracker is not None else None
    if found is None:
        found = _from_records(results_dirs, ctx, rec)
    if varies_nccl(ctx.sweep_axes):
        found = [r for r in found if r.nccl in (None, nccl)]
    return found


def varies_nccl(axes: list[str]) -> bool:
    return any(a.lstrip("+~") == "nccl" or a.lstrip("+~").startswith("nccl.") for a in axes)


def _from_records(results_dirs: list[str], ctx: JobContext, rec: JobRecord) -> list[drift.Reference]:
    want = drift.identity(rec.config)
    refs = []
    for d in results_dirs:
        for other in results.collect(abs_path(ctx.root, d)):
            key = measures_baseline(other)
            if key is None or other.record_id == rec.record_id or drift.identity(other.config) != want:
                continue
            m = other.metrics
            ci = (m[f"{key}_ci95_lo"], m[f"{key}_ci95_hi"]) if f"{key}_ci95_lo" in m else None
            refs.append(
                drift.Reference(
                    other.record_id,
                    m[key],
                    other.started_at,
                    ci,
                    other.server_env or {},
                    drift.data_hashes_of(other.provenance),
                    other.engine.version,
                    other.choice("nccl"),
                    paired=key != "throughput_tok_s",
                )
            )
    return refs


def abs_path(root: Path, p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else root / path
