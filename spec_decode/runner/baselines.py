"""The baseline a spec job is measured against, and the earlier ones its drift guard compares with: the
baseline arm's config (the drafter off, spec.* kept), its job name and sharing key (the strategy
``baseline_strategy=job``: one baseline job per key in a sweep), and the earlier baselines of the same
identity (MLflow when reachable, else results.json under tracking.results_dirs)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from spec_decode.analysis import drift
from spec_decode.core.config import DrafterConfig, ExperimentConfig, config_hash, resolved_dict
from spec_decode.core.identity import SPEC_ITEM
from spec_decode.record import results
from spec_decode.record.results import JobRecord
from spec_decode.runner.context import JobContext

# Hydra's override_dirname joins "key=value" items with ","; values may hold commas ([1,3,4]).
_ITEM = re.compile(r",(?=[+~]*[\w./@-]+=)")


def baseline_config(cfg: ExperimentConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, drafter=DrafterConfig(name="none", path=None, layer_ids=None))


def baseline_name(run_name: str) -> str:
    """The baseline's job name: ``baseline`` plus the spec job's overrides that are not about
    speculation (``nccl=tuned,spec.steps=2`` -> ``baseline,nccl=tuned``). Unique per baseline in a
    sweep, stable across reruns: experiments key their metrics by it."""
    keep = [item for item in _ITEM.split(run_name) if item and not SPEC_ITEM.match(item)]
    return ",".join(["baseline", *keep])


def baseline_key(cfg: ExperimentConfig) -> str:
    """Jobs that share hardware, model, NCCL profile, engine and benchmark share one baseline."""
    data = resolved_dict(baseline_config(cfg))
    data.pop("spec", None)
    data.pop("name", None)
    data.pop("tracking", None)
    readable = f"hardware={cfg.hardware.name},model={cfg.model.name},nccl={cfg.nccl.name},engine={cfg.engine.name}"
    return f"{readable},{config_hash(data)[:8]}"


def earlier_baselines(cfg: ExperimentConfig, ctx: JobContext, rec: JobRecord) -> list[drift.Reference]:
    """The drift guard's reference: earlier baselines from MLflow when tracking is on and reachable,
    else from the results.json files under tracking.results_dirs."""
    if ctx.tracker is not None:
        found = ctx.tracker.earlier_baselines(rec)
        if found is not None:
            return found
    want = drift.identity(rec.config)
    refs = []
    for d in cfg.tracking.results_dirs:
        for other in results.collect(abs_path(ctx.root, d)):
            if (
                other.role == "baseline"
                and other.status == "FINISHED"
                and other.record_id != rec.record_id
                and "throughput_tok_s" in other.metrics
                and drift.identity(other.config) == want
            ):
                m = other.metrics
                ci = (
                    (m["throughput_tok_s_ci95_lo"], m["throughput_tok_s_ci95_hi"])
                    if "throughput_tok_s_ci95_lo" in m
                    else None
                )
                refs.append(
                    drift.Reference(
                        other.record_id,
                        m["throughput_tok_s"],
                        other.started_at,
                        ci,
                        other.server_env or {},
                        drift.data_hashes_of(other.provenance),
                        other.engine.version,
                    )
                )
    return refs


def abs_path(root: Path, p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else root / path
