"""Drafter lineage: training data -> drafter -> benchmark, in MLflow.

Each drafter training (``build drafter``) is one MLflow run in the experiment ``drafter-training``:
the loss curve and per-position top-1 agreement by step, the held-out per-position acceptance, the
data set's hash and size as params, the weights' sha256 as a tag. The run id goes back into the
drafter's training.json (``mlflow.run_id``), next to the data's md5, so a benchmark run can carry both
as tags (``lineage_tags``).

Store: ``--mlflow-uri`` if given, else $MLFLOW_TRACKING_URI, else ``sqlite:///mlflow.db`` in the
working directory (the runner's default store, tracking=local, so training and benchmark runs sit in
one UI). Logging never fails the stage: an unreachable or broken store prints a warning and the
drafter is kept.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from spec_decode.core import store
from spec_decode.core.gc_imports import frozen_imports

EXPERIMENT = "drafter-training"
DEFAULT_URI = store.DEFAULT_URI


def resolve_uri(uri: str | None) -> str | None:
    return None if uri == "off" else store.store_uri(uri)


def training_params(rec: dict) -> dict[str, str]:
    data = rec.get("data", {})
    return {
        "data.file_md5": data.get("file_md5"),
        "data.samples": data.get("samples"),
        "data.samples_available": data.get("samples_available"),
        "data.path": data.get("path"),
        "data.train_subset_sha256": data.get("train_subset_sha256"),
        "data.temperature": data.get("temperature"),
        "layer_ids": ",".join(map(str, rec["trained_aux_layer_ids"])),
        "steps": rec["steps"],
        "batch": rec["batch"],
        "seq": rec["seq"],
        "ttt_steps": rec["ttt_steps"],
        "lr": rec.get("lr"),
        "seed": rec["seed"],
        "threads": rec["threads"],
        "epochs": rec.get("epochs"),
        "params": rec["params"],
    }


def log_training(model_dir: Path, history: list[dict], heldout: dict, uri: str | None, wall_s: float) -> str | None:
    """Log one training (model_dir holds its training.json). Returns the run id, or None when not logged."""
    rec = json.loads((model_dir / "training.json").read_text())
    uri = resolve_uri(uri)
    if uri is None:
        return None
    try:
        return _log(uri, model_dir, rec, history, heldout, wall_s)
    except Exception as e:  # noqa: BLE001 -- any store failure: warn, keep the drafter
        print(f"WARNING: drafter training not logged to MLflow ({uri}): {type(e).__name__}: {e}", flush=True)
        return None


def _log(uri: str, model_dir: Path, rec: dict, history: list[dict], heldout: dict, wall_s: float) -> str:
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with frozen_imports():  # lazy: mlflow costs seconds of start-up; the embedded engine's build imports this module
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        exp_id = exp.experiment_id
    else:
        location = None if uri.startswith("http") else (Path.cwd() / "mlartifacts").resolve().as_uri()
        exp_id = client.create_experiment(EXPERIMENT, artifact_location=location)
    data = rec.get("data", {})
    name = f"{model_dir.name} n={data.get('samples')} ids={','.join(map(str, rec['trained_aux_layer_ids']))}"
    tags = {
        "weights_sha256": rec["weights_sha256"],
        "data.file_md5": str(data.get("file_md5")),
        "target_weights_sha256": rec["target_weights_sha256"],
        "model_dir": str(model_dir),
        "mlflow.runName": name,
    }
    run = client.create_run(exp_id, run_name=name, tags=tags)
    rid = run.info.run_id
    now = int(time.time() * 1000)
    metrics = []
    for h in history:
        metrics.append(Metric("loss", h["loss"], now, h["step"]))
        metrics += [Metric(f"top1_pos{j}", a, now, h["step"]) for j, a in enumerate(h["top1"], start=1)]
    for j, (a, c) in enumerate(zip(heldout["top1"], heldout["chain"]), start=1):
        metrics += [Metric(f"heldout_top1_pos{j}", a, now, 0), Metric(f"heldout_chain_accept_pos{j}", c, now, 0)]
    metrics += [Metric(f"heldout_accept_len_steps{k}", v, now, 0) for k, v in enumerate(heldout["accept_len"], 1)]
    metrics.append(Metric("train_wall_s", wall_s, now, 0))
    params = [Param(k, str(v)) for k, v in training_params(rec).items()]
    for i in range(0, len(metrics), 900):  # MLflow's batch limit is 1000 metrics
        client.log_batch(
            rid,
            metrics=metrics[i : i + 900],
            params=params if i == 0 else [],
            tags=[RunTag("heldout_positions", str(heldout["positions"]))] if i == 0 else [],
        )
    client.log_artifact(rid, str(model_dir / "training.json"))
    client.set_terminated(rid, "FINISHED")
    print(f"drafter training logged: MLflow {uri} experiment {EXPERIMENT} run {rid}", flush=True)
    return rid


def training_run_id(weights_sha256: str, uri: str | None) -> str | None:
    """The newest FINISHED training run of these weights in the store, or None (not found, no store)."""
    uri = resolve_uri(uri)
    if uri is None or ((f := store.sqlite_file(uri)) is not None and not f.is_file()):
        return None  # no store: reading must not create one
    try:
        with frozen_imports():  # lazy: as in log_training
            from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(EXPERIMENT)
        if exp is None:
            return None
        runs = client.search_runs(
            [exp.experiment_id],
            f"tags.weights_sha256 = '{weights_sha256}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None
    except Exception as e:  # noqa: BLE001 -- lineage is a link, never a reason to fail a job
        print(f"WARNING: drafter training run not looked up in {uri}: {type(e).__name__}: {e}", flush=True)
        return None


def lineage_tags(drafter_dir: str | Path, uri: str | None = "off") -> dict[str, str]:
    """The tags a benchmark run carries to lead back to its drafter's training:
    ``drafter.weights_sha256``, ``drafter.data_md5`` (= the DVC md5 of data/drafter_train/samples.safetensors),
    ``drafter.data_samples``, ``drafter.data_subset_sha256``, and with a store (``uri``, 'off' = none)
    ``drafter.training_run_id``. Empty when the drafter has no training.json (e.g. a downloaded one)."""
    path = Path(drafter_dir) / "training.json"
    if not path.is_file():
        return {}
    rec = json.loads(path.read_text())
    data = rec.get("data") or {}
    tags = {
        "drafter.weights_sha256": rec.get("weights_sha256"),
        "drafter.data_md5": data.get("file_md5"),
        "drafter.data_samples": data.get("samples"),
        "drafter.data_subset_sha256": data.get("train_subset_sha256"),
    }
    if rec.get("weights_sha256"):
        tags["drafter.training_run_id"] = training_run_id(rec["weights_sha256"], uri)
    return {k: str(v) for k, v in tags.items() if v is not None}
