"""MLflow: one run per job (a child of the sweep's parent run in a multirun), a view of results.json.

- ``Tracker`` talks to the store through ``MlflowClient`` only (no fluent active-run state, so nothing
  leaks between sweep jobs run in one process). The store is initialised once, by the first call.
- An unreachable store never costs a measurement: the job keeps results.json and a warning says how
  to upload later with ``python -m spec_decode.views.tracking sync <dir>`` (idempotent: runs are matched by
  the record id tag).
- It only reads the job record: the job computes everything (checks, drift) and writes results.json
  once before ``Tracker.finish`` logs it. ``earlier_baselines`` reads earlier runs for the job's drift
  guard. The sweep's parent run is ``spec_decode.views.sweep.SweepCallback``'s.

Names (DESIGN §3.6): metrics carry units (``throughput_tok_s``, ``cycle_ms``...), params are the
flattened config plus the group choices (``nccl``, ``drafter``...), tags hold provenance.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from filelock import FileLock

from spec_decode.analysis import drift
from spec_decode.core.config import flatten
from spec_decode.record import results
from spec_decode.record.results import JobRecord
from spec_decode.runner import interrupt
from spec_decode.runner.context import JobContext
from spec_decode.views import charts

PARENT_ENV = "SPEC_DECODE_PARENT_RUN_ID"
RECORD_TAG = "spec_decode.record_id"
LOGGED_TAG = "spec_decode.logged"  # set with the record's data: a run without it is incomplete
ENV_PARAM = "server_env."  # params holding the live server environment
GROUPS = ("hardware", "nccl", "drafter", "model", "engine")
ARTIFACTS = ("results.json", "server.log")
PROFILE_GLOB = "profile.*.jsonl"  # one per rank: .dp<d>.tp<t> (older: .rank<t>) (spec_decode.parsers.profile)

EXPERIMENT_KIND = "custom_model_development"
DESCRIPTION = (
    "Speculative-decoding benchmarks from spec-decode-bench. One parent run per sweep (its description "
    "holds the sweep's table; plots under Artifacts > plots); one child per job, named by what varies "
    "(`steps=3 nccl=default`, `baseline nccl=default`). Each job's results.json (artifact) is the "
    'authoritative record. Views > "speedup by steps" shows the key metrics side by side.'
)
# What the 3.17.2 UI obeys (its JS bundle): the URL's workflowType, else localStorage (default genai:
# Overview + "Detect Issues"), not experimentKind; a shared view drops runsExpanded, and a first visit
# unfolds every parent whose children carry mlflow.runType=evaluation. docs/mlflow.md has the details.
WORKFLOW = "workflowType=machine_learning"
CHILD_TAGS = {"mlflow.runType": "evaluation"}
# A saved runs-table view (MLflow >= 3.15 keeps them as experiment tags mlflow.sharedViewState.<key>):
# the columns a performance engineer compares, in order; opened by ?viewStateShareKey=<key>.
VIEW_KEY = "spec-decode-speedup"
VIEW_NAME = "speedup by steps"
VIEW_METRICS = (
    "throughput_tok_s",
    "speedup_vs_baseline",
    "speedup_vs_baseline_ci95_lo",
    "speedup_vs_baseline_ci95_hi",
    "accept_len",
    "cycle_ms",
    "non_cycle_pct",
    "throughput_tok_s_cv",
)
VIEW_PARAMS = ("spec.steps", "nccl")
VIEW_TAGS = ("checks.failed",)
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


def _quiet_mlflow() -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")


def resolve_uri(uri: str, root: Path) -> str:
    """Relative sqlite paths resolve against the project root (not the job dir)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str((root / uri[len(prefix) :]).resolve())
    return uri


def resolve_artifacts(location: str, root: Path) -> str:
    if "://" in location or location.startswith("mlflow-artifacts:"):
        return location
    return (root / location).resolve().as_uri()


def _store_lock(uri: str):
    """Serialise the first use of a sqlite store across processes: two sweeps creating the schema at
    once race ("duplicate column name", "table already exists")."""
    if not uri.startswith("sqlite:///"):
        return nullcontext()
    path = Path(uri[len("sqlite:///") :] + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


class Tracker:
    def __init__(self, uri: str, experiment: str, artifact_location: str, root: Path):
        _quiet_mlflow()
        self.uri = resolve_uri(uri, root)
        self.artifact_location = resolve_artifacts(artifact_location, root)
        self.experiment = experiment
        self._client = None
        self._exp_id: str | None = None
        self._children: set[str] = set()  # runs opened as a sweep's child

    @classmethod
    def from_config(cls, tcfg: Any, root: Path) -> Tracker | None:
        if not tcfg.enabled:
            return None
        uri = os.environ.get("MLFLOW_TRACKING_URI") if tcfg.uri in ("", "env") else tcfg.uri
        return cls(uri or "sqlite:///mlflow.db", tcfg.experiment, tcfg.artifact_location, root)

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self.reachable()
            # schema creation/migration happens once, under the lock, and whole (a Ctrl-C waits for it)
            with interrupt.deferred(), _store_lock(self.uri):
                client = MlflowClient(tracking_uri=self.uri)
                client.search_experiments(max_results=1)
            self._client = client
        return self._client

    def reachable(self) -> None:
        """Fail fast on a dead tracking server (MLflow's client would retry for minutes)."""
        if self.uri.startswith(("http://", "https://")):
            import requests

            try:
                requests.get(self.uri.rstrip("/") + "/health", timeout=3).raise_for_status()
            except requests.RequestException as e:
                raise ConnectionError(f"no MLflow server answers at {self.uri}: {e}") from None

    def experiment_id(self) -> str:
        if self._exp_id is None:
            self.client  # noqa: B018 - creates the store under the lock first
            with _store_lock(self.uri):
                self._exp_id = self._get_or_create_experiment()
                have = self.client.get_experiment(self._exp_id).tags
                for key, value in experiment_tags().items():  # also on experiments made before
                    if key not in have:  # a user's edits and the latest sweep's view stay
                        self.client.set_experiment_tag(self._exp_id, key, value)
        return self._exp_id

    def ui_url(self, run_id: str | None = None, host: str = "http://127.0.0.1:5000") -> str:
        """Where to look in ``mlflow ui``: the run, or the experiment's compare view."""
        exp = self.experiment_id()
        if run_id:
            return f"{host}/#/experiments/{exp}/runs/{run_id}?{WORKFLOW}"
        return f"{host}/#/experiments/{exp}/runs?{WORKFLOW}&viewStateShareKey={VIEW_KEY}"

    def ui_command(self) -> str:
        if self.uri.startswith("sqlite:///"):
            return f"mlflow ui --backend-store-uri {self.uri}"
        return f"open {self.uri}"

    def _get_or_create_experiment(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(
                self.experiment,
                artifact_location=None if self.uri.startswith("http") else self.artifact_location,
            )
        except Exception:  # created concurrently by a process without our lock (a server store)
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    # ---- a job's run --------------------------------------------------------------------------------
    def start(self, rec: JobRecord, ctx: JobContext) -> str | None:
        """Create the job's run (RUNNING) so the UI shows it while it runs. None if unreachable (the
        job then records a warning saying how to upload later)."""
        tags = {RECORD_TAG: rec.record_id, "spec_decode.role": rec.role, "spec_decode.out_dir": str(ctx.out_dir)}
        if ctx.parent_run_id:
            tags.update({"mlflow.parentRunId": ctx.parent_run_id, **CHILD_TAGS})  # the parent opens unfolded
        try:
            run = self.client.create_run(self.experiment_id(), run_name=display_name(rec), tags=tags)
        except Exception as e:  # noqa: BLE001 - any store failure: keep measuring
            rec.warnings.append(self._unreachable(e))
            return None
        rec.mlflow_run_id = run.info.run_id
        if ctx.parent_run_id:
            self._children.add(run.info.run_id)
        interrupt.opened(run.info.run_id, self.client)  # a Ctrl-C from here on ends it KILLED
        return run.info.run_id

    def earlier_baselines(self, rec: JobRecord) -> list[drift.Reference] | None:
        """Earlier FINISHED baselines with the same identity (drift.identity); None if unreachable."""
        ident = drift.identity(rec.config)
        filt = " and ".join(
            ["params.role = 'baseline'", "attributes.status = 'FINISHED'"]
            + [f"params.`{k}` = '{v}'" for k, v in ident.items()]
        )
        try:
            found = self.client.search_runs([self.experiment_id()], filt, max_results=50)
        except Exception as e:  # noqa: BLE001
            self._unreachable(e)
            return None
        refs = []
        for r in found:
            m = r.data.metrics
            if r.info.run_id == rec.mlflow_run_id or "throughput_tok_s" not in m:
                continue
            ci = (
                (m["throughput_tok_s_ci95_lo"], m["throughput_tok_s_ci95_hi"])
                if "throughput_tok_s_ci95_lo" in m
                else None
            )
            env = {k[len(ENV_PARAM) :]: v for k, v in r.data.params.items() if k.startswith(ENV_PARAM)}
            hashes = {
                k[len("data.") : -len(".hash")]: v
                for k, v in r.data.tags.items()
                if k.startswith("data.") and k.endswith(".hash")
            }
            refs.append(
                drift.Reference(
                    r.info.run_id,
                    m["throughput_tok_s"],
                    r.info.start_time / 1e3,
                    ci,
                    env,
                    hashes,
                    r.data.tags.get("engine.version"),
                )
            )
        return refs

    def finish(self, run_id: str | None, rec: JobRecord, out_dir: Path) -> None:
        """Log the written record to the run and close it. Reads only: a store failure here is a console
        warning, and ``sync`` completes the run later."""
        if run_id is None:
            return
        try:
            # a sweep's child gets no charts of its own: the parent's (one chart set over all jobs,
            # drawn once per sweep) hold them; rendering per child was most of a job's harness time
            log_record(self.client, run_id, rec, out_dir, plots=run_id not in self._children)
            self.client.set_terminated(run_id, status=_status(rec.status))
            interrupt.closed(run_id)
        except Exception as e:  # noqa: BLE001
            print(f"warning: {self._unreachable(e)}", file=sys.stderr)

    def _unreachable(self, e: Exception) -> str:
        msg = (
            f"MLflow store {self.uri} unreachable ({type(e).__name__}: {str(e)[:200]}); results stay "
            f"in results.json; upload later: python -m spec_decode.views.tracking sync <dir>"
        )
        print(f"warning: {msg}", file=sys.stderr)
        return msg


def _status(status: str) -> str:
    return status if status in ("FINISHED", "FAILED", "KILLED") else "FAILED"


def experiment_tags(expanded: list[str] | tuple = ()) -> dict[str, str]:
    """The experiment's kind, description and saved view (``expanded``: kept, though 3.17.2 ignores it)."""
    cols = (
        [f"params.`{p}`" for p in VIEW_PARAMS]
        + [f"metrics.`{m}`" for m in VIEW_METRICS]
        + [f"tags.`{t}`" for t in VIEW_TAGS]
    )
    widths = {c: 120 for c in cols}  # wide enough for a metric's name and value
    widths.update({f"metrics.`{m}`": 190 for m in VIEW_METRICS if m.startswith("speedup")})
    state = {
        "selectedColumns": cols,
        "columnOrder": cols,
        "columnWidths": widths,
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "runsHiddenMode": "SHOW_ALL",
        "searchFilter": "",
        "runsExpanded": {run_id: True for run_id in expanded},
    }
    now = int(time.time() * 1000)
    view = {"name": VIEW_NAME, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    return {
        "mlflow.experimentKind": EXPERIMENT_KIND,
        "mlflow.note.content": DESCRIPTION,
        f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(view, separators=(",", ":")),
    }


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
    return {k: ("" if v is None else str(v))[:6000] for k, v in out.items()}


def tags_of(rec: JobRecord) -> dict[str, str]:
    prov = rec.provenance
    git = prov.get("git", {})
    tags = {
        "git.commit": str(git.get("commit")),
        "git.dirty": str(git.get("dirty")),
        "config_hash": rec.config_hash,
        "engine": rec.engine.name,
        "engine.version": str(rec.engine.version),
        "experiment": rec.experiment,
        "status_detail": rec.status + (f": {rec.error[:4000]}" if rec.error else ""),
        LOGGED_TAG: "true",
    }
    for name, h in (prov.get("data") or {}).items():
        tags[f"data.{name}.path"] = str(h.get("path"))
        tags[f"data.{name}.hash"] = str(h.get("dvc_md5") or h.get("sha256") or "missing")
        if h.get("dvc_md5"):
            tags[f"dvc.{name}.md5"] = h["dvc_md5"]
    tags.update(prov.get("drafter_lineage") or {})  # drafter.training_run_id, drafter.data_md5, ...
    fp = prov.get("host") or {}  # the host fingerprint (record/host.py); its load figures are metrics
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
    if rec.baseline is not None and rec.baseline.mlflow_run_id:
        tags["baseline_run_id"] = rec.baseline.mlflow_run_id
    return tags


def log_record(client, run_id: str, rec: JobRecord, out_dir: Path, plots: bool = True) -> None:
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
    lock = Path(rec.provenance.get("root", ".")) / "dvc.lock"
    if lock.exists():
        client.log_artifact(run_id, str(lock), artifact_path="dvc")
    if plots:
        log_acceptance_plots(client, run_id, rec)


def log_acceptance_plots(client, run_id: str, rec: JobRecord) -> None:
    """The job's acceptance histogram and rate-by-position charts under plots/ (drawn in a temp dir:
    the job dir holds only what the job wrote)."""
    figs = charts.acceptance_figures([rec])
    if not figs:
        return
    with tempfile.TemporaryDirectory(prefix="spec_decode_plots_") as tmp:
        for name, fig in figs.items():
            client.log_artifact(run_id, str(charts.save(fig, Path(tmp) / name)), artifact_path="plots")


if __name__ == "__main__":  # `python -m spec_decode.views.tracking sync DIR`: the command lives in views.sync
    from spec_decode.views.sync import main  # lazy: views.sync imports this module

    main()
