"""A job record as an MLflow run: its name, params (the flattened config and the group choices), metrics
(rounded by unit), tags (provenance, checks, the record id) and artifacts (results.json, server.log, one
profile per rank, the acceptance plots). Reads the record only; tracking.Tracker owns the store."""

from __future__ import annotations

import math
import re
import tempfile
import time
from pathlib import Path

from spec_decode.core.config import flatten
from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record import results
from spec_decode.record.results import JobRecord

RECORD_TAG = "spec_decode.record_id"


LOGGED_TAG = "spec_decode.logged"  # set with the record's data: a run without it is incomplete


ENV_PARAM = "server_env."  # params holding the live server environment


GROUPS = ("hardware", "nccl", "drafter", "model", "engine")


ARTIFACTS = ("results.json", "server.log")


PROFILE_GLOB = "profile.*.jsonl"  # one per rank: .dp<d>.tp<t> (older: .rank<t>) (spec_decode.parsers.profile)


# Precision kept when logging (MLflow shows every digit it is given): decimals by the metric's unit.
DECIMALS = (
    ("_tok_s", 1),
    ("_ms", 3),
    ("_pct", 2),
    ("_cv", 4),
    ("_s", 3),
    ("speedup", 4),
    ("accept", 4),
    ("ratio", 4),
    ("_us", 2),
)


def run_status(status: str) -> str:
    return status if status in ("FINISHED", "FAILED", "KILLED") else "FAILED"


def display_name(rec: JobRecord) -> str:
    """The run name, leading with what varies: ``steps=3 nccl=default``, ``baseline nccl=default``
    (the job's overrides, keys shortened to their last part: the step count first, then group choices,
    then other keys, so that MLflow's truncated name column still shows the sweep axes)."""
    items = [i for i in re.split(r",(?=[+~]*[\w./@-]+=)", rec.name or "") if i and i != "baseline"]
    steps = [i for i in items if i.split("=", 1)[0].lstrip("+~") == "spec.steps"]
    # then config-group choices (nccl=tuned: usually a sweep axis), then dotted keys (often fixed knobs)
    rest = sorted((i for i in items if i not in steps), key=lambda i: "." in i.split("=", 1)[0])
    head = ["baseline"] if rec.role == "baseline" else [f"steps={rec.steps}"] if rec.steps is not None else []
    short = [f"{k.lstrip('+~').rsplit('.', 1)[-1]}={v}" for k, v in (i.split("=", 1) for i in rest)]
    return " ".join(head + short) or "defaults"


def rounded(name: str, value: float) -> float:
    for suffix, places in DECIMALS:  # the unit at the end wins (throughput_tok_s_cv is a fraction)
        if name.endswith(suffix) or name.startswith(suffix):
            return round(value, places)
    for suffix, places in DECIMALS:  # then a unit inside (throughput_tok_s_ci95_lo, nccl_allreduce_us_4096)
        if f"{suffix}_" in name:
            return round(value, places)
    return float(f"{value:.6g}")


def params_of(rec: JobRecord) -> dict[str, str]:
    out = dict(flatten(rec.config))
    if not rec.speculative:  # a baseline runs no speculation, whatever spec.* defaults to: say so
        out.update({k: "none" for k in out if k.startswith("spec.")})
    for g in GROUPS:  # the group choices, as the sweep axes name them
        out[g] = rec.choice(g)
    out["speculative"] = rec.speculative
    out["role"] = rec.role
    return {k: param_value(v)[:6000] for k, v in out.items()}


def param_value(v) -> str:
    """A config value as an MLflow param holds it (None as "")."""
    return "" if v is None else str(v)


def tags_of(rec: JobRecord) -> dict[str, str]:
    prov = rec.provenance
    git = prov.git or {}
    tags = {
        "git.commit": str(git.get("commit")),
        "git.dirty": str(git.get("dirty")),
        **({"git.tree": str(git["tree"])} if git.get("tree") else {}),
        "config_hash": rec.config_hash,
        "engine": rec.engine.name,
        "engine.version": str(rec.engine.version),
        "experiment": rec.experiment,
        "status_detail": rec.status + (f": {rec.error[:4000]}" if rec.error else ""),
        LOGGED_TAG: "true",
    }
    for name, h in (prov.data or {}).items():
        tags[f"data.{name}.path"] = str(h.get("path"))
        tags[f"data.{name}.hash"] = str(h.get("dvc_md5") or h.get("sha256") or "missing")
        if h.get("dvc_md5"):
            tags[f"dvc.{name}.md5"] = h["dvc_md5"]
    tags.update(prov.drafter_lineage or {})  # drafter.training_run_id, drafter.data_md5, ...
    fp = prov.host or {}  # the host fingerprint (runner/machine.py); its load figures are metrics
    tags.update(
        {
            "host.cpu": str(fp.get("cpu_model")),
            "host.cores": str(fp.get("logical_cores")),
            "host.isa": " ".join(fp.get("isa") or []),
            "host.gpu": str((fp.get("gpus") or [{}])[0].get("name")),
        }
    )
    tags["checks.failed"] = ",".join(rec.failed_checks) or "none"
    if rec.warnings:
        tags["warnings"] = " | ".join(rec.warnings)[:4000]
    if results.performance_only(rec):
        tags["spec_decode.performance_only"] = "true"
    if rec.speedup_vs_baseline:  # paired: the job measured its own baseline (a drift reference)
        tags["speedup.method"] = str(rec.speedup_vs_baseline.method)
    if rec.baseline is not None and rec.baseline.mlflow_run_id:
        tags["baseline_run_id"] = rec.baseline.mlflow_run_id
    return tags


def log_record(client, run_id: str, rec: JobRecord, out_dir: Path, plots: bool = True) -> None:
    with frozen_imports():  # lazy: mlflow costs seconds of start-up (tracking=off)
        from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    metrics = [Metric(k, rounded(k, v), now, 0) for k, v in rec.metrics.items() if math.isfinite(v)]
    metrics += [
        Metric("run_throughput_tok_s", rounded("_tok_s", r.throughput_tok_s), now, i) for i, r in enumerate(rec.runs)
    ]
    params = [Param(k, v) for k, v in params_of(rec).items()]
    params += [Param(f"{ENV_PARAM}{k}", v) for k, v in (rec.server_env or {}).items()]
    tags = [RunTag(k, v) for k, v in tags_of(rec).items()]
    for i in range(0, max(len(params), 1), 100):  # MLflow caps a batch at 100 params
        client.log_batch(
            run_id, metrics=metrics if i == 0 else [], params=params[i : i + 100], tags=tags if i == 0 else []
        )
    for name in ARTIFACTS:
        if (out_dir / name).exists():
            client.log_artifact(run_id, str(out_dir / name))
    for path in sorted(out_dir.glob(PROFILE_GLOB)):
        client.log_artifact(run_id, str(path), artifact_path="profile")
    hydra_cfg = out_dir / ".hydra" / "config.yaml"
    if hydra_cfg.exists():
        client.log_artifact(run_id, str(hydra_cfg), artifact_path="hydra")
    lock = Path(rec.provenance.root or ".") / "dvc.lock"
    if lock.exists():
        client.log_artifact(run_id, str(lock), artifact_path="dvc")
    if plots:
        log_acceptance_plots(client, run_id, rec)


def log_acceptance_plots(client, run_id: str, rec: JobRecord) -> None:
    """The job's acceptance histogram and rate-by-position charts under plots/ (drawn in a temp dir:
    the job dir holds only what the job wrote)."""
    from spec_decode.views import charts  # lazy: the cost model's scipy.optimize, ~0.2 s of CPU at start-up

    figs = charts.acceptance_figures([rec])
    if not figs:
        return
    with tempfile.TemporaryDirectory(prefix="spec_decode_plots_") as tmp:
        for name, fig in figs.items():
            client.log_artifact(run_id, str(charts.save(fig, Path(tmp) / name)), artifact_path="plots")
