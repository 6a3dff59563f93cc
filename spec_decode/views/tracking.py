"""MLflow: one run per job (a child of the sweep's parent run in a multirun), a view of results.json.

- ``Tracker`` talks to the store through ``MlflowClient`` only (no fluent active-run state, so nothing
  leaks between sweep jobs run in one process). The store is initialised once, by the first call.
- An unreachable store never costs a measurement: the job keeps results.json and a warning says how
  to upload later with ``python -m spec_decode.views.tracking sync <dir>`` (idempotent: runs are matched by
  the record id tag): ``sync`` and ``main`` below (or ``spec-decode sync DIR``).
- It only reads the job record: the job computes everything (checks, drift) and writes results.json
  once before ``Tracker.finish`` logs it. ``earlier_baselines`` reads earlier runs for the job's drift
  guard. The sweep's parent run is ``spec_decode.views.sweep.SweepCallback``'s.

Names (DESIGN §3.6): metrics carry units (``throughput_tok_s``, ``cycle_ms``...), params are the
flattened config plus the group choices (``nccl``, ``drafter``...), tags hold provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from filelock import FileLock

from spec_decode.analysis import drift
from spec_decode.core import store
from spec_decode.core.gc_imports import frozen_imports
from spec_decode.record import results
from spec_decode.record.results import JobRecord
from spec_decode.runner import interrupt
from spec_decode.runner.context import JobContext
from spec_decode.views.mlflow_run import (
    ENV_PARAM,
    LOGGED_TAG,
    RECORD_TAG,
    display_name,
    log_record,
    param_value,
    run_status,
)

PARENT_ENV = "SPEC_DECODE_PARENT_RUN_ID"

EXPERIMENT_KIND = "custom_model_development"
DESCRIPTION = (
    "Speculative-decoding benchmarks from spec-decode-bench. One parent run per sweep (its description "
    "holds the sweep's table; plots under Artifacts > plots); one child per job, named by what varies "
    "(`steps=3 nccl=default`, `baseline nccl=default`). Each job's results.json (artifact) is the "
    'authoritative record. Views > "speedup by steps" shows the key metrics side by side.'
)
# What the 3.17.2 UI obeys (its JS bundle): the URL's workflowType, else localStorage (default genai:
# Overview + "Detect Issues"), not experimentKind (kept for UIs that read it); a shared view drops
# runsExpanded, and a first visit unfolds every parent whose children carry mlflow.runType=evaluation.
# The links we print carry workflowType; a click in the UI has none, so the UI we name is
# `mlflow ui --app-name spec-decode` (views/mlflow_app.py: "Model training" where the browser never chose).
# docs/mlflow.md has the details.
WORKFLOW = "workflowType=machine_learning"
UI_APP = "spec-decode"  # the mlflow.app entry point (pyproject.toml)
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
            with frozen_imports():  # lazy: seconds of start-up, paid on first use only
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
            import requests  # lazy: only an http(s) store is probed

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
            return f"mlflow ui --backend-store-uri {self.uri} --app-name {UI_APP}"
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
        """Earlier FINISHED baselines with the same identity (drift.identity): baseline jobs and paired spec
        jobs' baseline arms (tag ``speedup.method=paired``); None if unreachable."""
        ident = drift.identity(rec.config)
        # Scalars in the search filter; a list (engine.extra_args) is compared with its logged str() after
        # (its quotes do not fit the filter's syntax).
        scalar = {k: param_value(v) for k, v in ident.items() if not isinstance(v, (list, tuple))}
        listed = {k: param_value(v) for k, v in ident.items() if k not in scalar}
        # An option added later is left out of the identity at its default (records from before it match):
        # the search then cannot tell its other values apart, so a run that logged another value is skipped.
        added = {f"engine.{k}": param_value(v) for k, v in drift.ADDED_DEFAULTS.items() if f"engine.{k}" not in ident}
        filt = " and ".join(["attributes.status = 'FINISHED'"] + [f"params.`{k}` = '{v}'" for k, v in scalar.items()])
        try:
            found = self.client.search_runs([self.experiment_id()], filt, max_results=50)
        except Exception as e:  # noqa: BLE001
            self._unreachable(e)
            return None
        refs = []
        for r in found:
            m = r.data.metrics
            paired = r.data.params.get("role") != "baseline"
            key = "baseline_throughput_tok_s" if paired else "throughput_tok_s"
            if r.info.run_id == rec.mlflow_run_id or key not in m:
                continue
            if any(r.data.params.get(k) != v for k, v in listed.items()):
                continue  # other engine flags: another setup
            if any(r.data.params.get(k, v) != v for k, v in added.items()):
                continue  # an added option at another value than its default: another setup
            if paired and r.data.tags.get("speedup.method") != "paired":
                continue  # a spec job against a baseline job: that job is the reference
            ci = (m[f"{key}_ci95_lo"], m[f"{key}_ci95_hi"]) if f"{key}_ci95_lo" in m else None
            env = {k[len(ENV_PARAM) :]: v for k, v in r.data.params.items() if k.startswith(ENV_PARAM)}
            hashes = {
                k[len("data.") : -len(".hash")]: v
                for k, v in r.data.tags.items()
                if k.startswith("data.") and k.endswith(".hash")
            }
            refs.append(
                drift.Reference(
                    r.info.run_id,
                    m[key],
                    r.info.start_time / 1e3,
                    ci,
                    env,
                    hashes,
                    r.data.tags.get("engine.version"),
                    r.data.params.get("nccl"),
                    paired=paired,
                )
            )
        return refs

    def finish(self, run_id: str | None, rec: JobRecord, out_dir: Path) -> None:
        """Log the written record to the run and close it. Reads only: a store failure here is a console
        warning, and ``sync`` completes the run later."""
        if run_id is None:
            return
        try:
            # a sweep's child gets its charts when the sweep ends (views.sweep, with the parent's set):
            # rendering them here was most of a job's harness time
            log_record(self.client, run_id, rec, out_dir, plots=run_id not in self._children)
            self.client.set_terminated(run_id, status=run_status(rec.status))
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


# ---- sync: upload what never reached the store -----------------------------------------------------


def sync(directory: Path, tracker: Tracker) -> tuple[int, int]:
    """Log every results.json under ``directory`` (schema 1 or 2) that is not fully in the store yet:
    no run with its record id, or one created at the job's start but never logged (the store went away
    mid-job). Reads the records, never rewrites them. Returns (uploaded, already_there)."""
    uploaded = present = 0
    for rec in results.collect(directory):
        found = tracker.client.search_runs([tracker.experiment_id()], f"tags.`{RECORD_TAG}` = '{rec.record_id}'")
        if any(r.data.tags.get(LOGGED_TAG) == "true" for r in found):
            present += 1
            continue
        if found:
            run_id = found[0].info.run_id
        else:
            run_id = tracker.client.create_run(
                tracker.experiment_id(),
                run_name=display_name(rec),
                tags={
                    RECORD_TAG: rec.record_id,
                    "spec_decode.role": rec.role,
                    "spec_decode.synced": "true",
                    "spec_decode.out_dir": rec.out_dir,
                },
            ).info.run_id
        log_record(tracker.client, run_id, rec, Path(rec.out_dir))
        tracker.client.set_terminated(run_id, status=run_status(rec.status))
        uploaded += 1
    return uploaded, present


SYNC_HELP = (
    "Upload the job records (results.json) under DIR that never reached the MLflow store (it was down, or "
    "tracking was off): one run per job in --experiment, with the record's metrics, params, tags and "
    "artifacts, as the job would have logged it. A run the job opened at its start but never completed "
    "(the store went away mid-job) is completed in place; it keeps its sweep parent. Other runs come in as "
    "top-level runs tagged spec_decode.synced=true: sync makes no sweep parent run. Idempotent: records "
    "are matched by their record id, so a record already logged is skipped and a second sync uploads "
    "nothing (in another --experiment they are uploaded again). The results.json files are only read."
)


def main(argv: list[str] | None = None, prog: str = "python -m spec_decode.views.tracking") -> None:
    ap = argparse.ArgumentParser(prog=prog, description="Upload job results that never reached MLflow.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="log every results.json under DIR not yet in the store", description=SYNC_HELP)
    s.add_argument(
        "dir",
        type=Path,
        help="where to look for results.json, at any depth: a multirun sweep dir, a job dir, multirun/",
    )
    s.add_argument("--uri", default=None, help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    s.add_argument("--experiment", default="spec-decode-bench", help="the MLflow experiment (default: %(default)s)")
    s.add_argument(
        "--artifact-location",
        default="mlartifacts",
        help="where a new experiment keeps its artifacts, relative to the cwd (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        ap.error(f"{args.dir}: not a directory")
    tracker = Tracker(store.store_uri(args.uri), args.experiment, args.artifact_location, Path.cwd())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up, present = sync(args.dir, tracker)
    print(f"uploaded {up} run(s); {present} already in {tracker.uri}")


if __name__ == "__main__":  # `python -m spec_decode.views.tracking sync DIR`
    main()
