"""MLflow: one run per job (a child of the sweep's parent run in a multirun), logged from results.json.

- ``Tracker`` talks to the store through ``MlflowClient`` only (no fluent active-run state, so nothing
  leaks between sweep jobs run in one process). The store is initialised once, by the first call.
- An unreachable store never costs a measurement: the job keeps results.json and a warning says how
  to upload later with ``python -m spec_decode.tracking sync <dir>`` (idempotent: runs are matched by
  the record id tag).
- ``SweepCallback`` (a Hydra callback) opens the parent run at ``on_multirun_start``, hands its id to
  each job, and at the end writes the sweep summary and closes the parent FINISHED / FAILED / KILLED.

Names (DESIGN §3.6): metrics carry units (``throughput_tok_s``, ``cycle_ms``...), params are the
flattened config plus the group choices (``nccl``, ``drafter``...), tags hold provenance.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from . import results
from .config import flatten

PARENT_ENV = "SPEC_DECODE_PARENT_RUN_ID"
RECORD_TAG = "spec_decode.record_id"
GROUPS = ("hardware", "nccl", "drafter", "model", "engine")
ARTIFACTS = ("results.json", "server.log")
PROFILE_GLOB = "profile.rank*.jsonl"  # one per TP rank (spec_decode.parsers.profile)


def _quiet_mlflow() -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")


def resolve_uri(uri: str, root: Path) -> str:
    """Relative sqlite paths resolve against the project root (not the job dir)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str((root / uri[len(prefix):]).resolve())
    return uri


def resolve_artifacts(location: str, root: Path) -> str:
    if "://" in location or location.startswith("mlflow-artifacts:"):
        return location
    return (root / location).resolve().as_uri()


class _store_lock:
    """Serialise the first use of a sqlite store across processes: two sweeps creating the schema at
    once race ("duplicate column name", "table already exists")."""

    def __init__(self, uri: str):
        self.path = uri[len("sqlite:///"):] + ".lock" if uri.startswith("sqlite:///") else None
        self.fh = None

    def __enter__(self):
        if self.path:
            import fcntl

            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.path, "w")
            fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fh:
            self.fh.close()


class Tracker:
    def __init__(self, uri: str, experiment: str, artifact_location: str, root: Path):
        _quiet_mlflow()
        self.uri = resolve_uri(uri, root)
        self.artifact_location = resolve_artifacts(artifact_location, root)
        self.experiment = experiment
        self._client = None
        self._exp_id: str | None = None

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
            with _store_lock(self.uri):  # schema creation/migration happens once, under the lock
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
        return self._exp_id

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
    def start(self, rec: dict, ctx: Any) -> str | None:
        """Create the job's run (RUNNING) so the UI shows it while it runs. None if unreachable."""
        tags = {RECORD_TAG: rec.setdefault("record_id", os.urandom(8).hex()),
                "spec_decode.role": rec["role"], "spec_decode.out_dir": str(ctx.out_dir)}
        if ctx.parent_run_id:
            tags["mlflow.parentRunId"] = ctx.parent_run_id
        try:
            run = self.client.create_run(self.experiment_id(), run_name=rec.get("name") or "defaults",
                                         tags=tags)
        except Exception as e:  # noqa: BLE001 - any store failure: keep measuring
            self._unreachable(rec, e)
            return None
        rec["mlflow_run_id"] = run.info.run_id
        return run.info.run_id

    def finish(self, run_id: str | None, rec: dict, out_dir: Path) -> None:
        if run_id is None:
            return
        try:
            from . import drift

            drift.check(rec, self.client, self.experiment_id())
            log_record(self.client, run_id, rec, out_dir)
            self.client.set_terminated(run_id, status=_status(rec["status"]))
        except Exception as e:  # noqa: BLE001
            self._unreachable(rec, e)

    def _unreachable(self, rec: dict, e: Exception) -> None:
        msg = (f"MLflow store {self.uri} unreachable ({type(e).__name__}: {str(e)[:200]}); results stay "
               f"in results.json; upload later: python -m spec_decode.tracking sync <dir>")
        rec["warnings"].append(msg)
        rec.pop("mlflow_run_id", None)
        print(f"warning: {msg}", file=sys.stderr)


def _status(status: str) -> str:
    return status if status in ("FINISHED", "FAILED", "KILLED") else "FAILED"


def params_of(rec: dict) -> dict[str, str]:
    conf = rec["config"]
    out = {k: v for k, v in flatten(conf).items()}
    for g in GROUPS:  # the group choices, as the sweep axes name them
        out[g] = conf.get(g, {}).get("name")
    out["speculative"] = rec.get("speculative")
    out["role"] = rec["role"]
    return {k: ("" if v is None else str(v))[:6000] for k, v in out.items()}


def tags_of(rec: dict) -> dict[str, str]:
    prov = rec.get("provenance", {})
    git = prov.get("git", {})
    tags = {
        "git.commit": str(git.get("commit")), "git.dirty": str(git.get("dirty")),
        "config_hash": rec["config_hash"], "engine": rec["engine"]["name"],
        "engine.version": str(rec["engine"].get("version")), "experiment": rec.get("experiment", ""),
        "status_detail": rec["status"] + (f": {rec['error'][:4000]}" if rec.get("error") else ""),
    }
    for name, h in (prov.get("data") or {}).items():
        tags[f"data.{name}.path"] = str(h.get("path"))
        tags[f"data.{name}.hash"] = str(h.get("dvc_md5") or h.get("sha256") or "missing")
        if h.get("dvc_md5"):
            tags[f"dvc.{name}.md5"] = h["dvc_md5"]
    failed = [c["name"] for c in rec.get("checks", []) if c.get("ok") is False]
    tags["checks.failed"] = ",".join(failed) or "none"
    if rec.get("warnings"):
        tags["warnings"] = " | ".join(rec["warnings"])[:4000]
    if rec.get("baseline", {}).get("mlflow_run_id"):
        tags["baseline_run_id"] = rec["baseline"]["mlflow_run_id"]
    return tags


def log_record(client, run_id: str, rec: dict, out_dir: Path) -> None:
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in rec.get("metrics", {}).items()]
    metrics += [Metric("run_throughput_tok_s", r["throughput_tok_s"], now, i)
                for i, r in enumerate(rec.get("runs", []))]
    params = [Param(k, v) for k, v in params_of(rec).items()]
    params += [Param(f"server_env.{k}", v) for k, v in (rec.get("server_env") or {}).items()]
    tags = [RunTag(k, v) for k, v in tags_of(rec).items()]
    for i in range(0, max(len(params), 1), 100):  # MLflow caps a batch at 100 params
        client.log_batch(run_id, metrics=metrics if i == 0 else [], params=params[i : i + 100],
                         tags=tags if i == 0 else [])
    for name in ARTIFACTS:
        if (out_dir / name).exists():
            client.log_artifact(run_id, str(out_dir / name))
    for path in sorted(out_dir.glob(PROFILE_GLOB)):
        client.log_artifact(run_id, str(path), artifact_path="profile")
    hydra_cfg = out_dir / ".hydra" / "config.yaml"
    if hydra_cfg.exists():
        client.log_artifact(run_id, str(hydra_cfg), artifact_path="hydra")
    lock = Path(rec.get("provenance", {}).get("root", ".")) / "dvc.lock"
    if lock.exists():
        client.log_artifact(run_id, str(lock), artifact_path="dvc")


# ---- Hydra callback ------------------------------------------------------------------------------------
class SweepCallback(Callback):
    """Parent MLflow run per multirun; summary at the end (also on failure or Ctrl-C, via atexit)."""

    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.sweep_dir: str | None = None
        self._tracker: Tracker | None = None
        self._done = False

    def __getstate__(self) -> dict:
        # Shipped to submitit/joblib workers: the parent run id travels, the client does not.
        return {**self.__dict__, "_tracker": None}

    def on_multirun_start(self, config, **kwargs) -> None:
        from omegaconf import OmegaConf

        self.sweep_dir = str(Path(config.hydra.sweep.dir).resolve())
        Path(self.sweep_dir).mkdir(parents=True, exist_ok=True)
        root = Path(config.hydra.runtime.cwd)
        tcfg = config.tracking
        if config.get("dry_run"):
            return
        tracker = Tracker.from_config(tcfg, root)
        if tracker is not None:
            tags = {"spec_decode.role": "sweep", "spec_decode.sweep_dir": self.sweep_dir,
                    "sweep.overrides": " ".join(OmegaConf.select(config, "hydra.overrides.task") or []),
                    "experiment": str(config.get("name"))}
            try:
                run = tracker.client.create_run(tracker.experiment_id(),
                                                run_name=f"sweep {config.get('name')} {Path(self.sweep_dir).name}",
                                                tags=tags)
                self.parent_run_id = run.info.run_id
                self._tracker = tracker
            except Exception as e:  # noqa: BLE001
                print(f"warning: MLflow store {tracker.uri} unreachable ({e}); jobs keep results.json; "
                      "upload later: python -m spec_decode.tracking sync " + self.sweep_dir, file=sys.stderr)
        atexit.register(self._finalize)

    def on_job_start(self, config, **kwargs) -> None:
        # Read by run.py in the job's process (also under joblib/submitit: the callback is pickled).
        if self.parent_run_id:
            os.environ[PARENT_ENV] = self.parent_run_id
        if self.sweep_dir:
            os.environ["SPEC_DECODE_SWEEP_DIR"] = self.sweep_dir

    def on_multirun_end(self, config, **kwargs) -> None:
        self._finalize()

    def _finalize(self) -> None:
        if self._done or self.sweep_dir is None:
            return
        self._done = True
        from .report import sweep_summary

        recs = collect(Path(self.sweep_dir))
        text, table = sweep_summary(recs)
        print(text, file=sys.stderr)
        Path(self.sweep_dir, "sweep_summary.txt").write_text(text + "\n")
        statuses = {r["status"] for r in recs}
        status = "KILLED" if "KILLED" in statuses else ("FAILED" if statuses - {"FINISHED"} else "FINISHED")
        if not recs:
            status = "FAILED"
        if self._tracker is not None and self.parent_run_id:
            c = self._tracker.client
            try:
                c.log_text(self.parent_run_id, text, "sweep_summary.txt")
                c.log_table(self.parent_run_id, table, "sweep_summary.json")
                from .report import write_plots

                for png in write_plots(recs, Path(self.sweep_dir)):
                    c.log_artifact(self.parent_run_id, str(png), artifact_path="plots")
            except Exception as e:  # noqa: BLE001 - the summary is a view; the status must still land
                print(f"warning: sweep summary not logged to MLflow: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                try:
                    c.set_terminated(self.parent_run_id, status=status)
                except Exception as e:  # noqa: BLE001
                    print(f"warning: could not close the MLflow parent run: {e}", file=sys.stderr)


def collect(directory: Path) -> list[dict]:
    """Every results.json under a directory, oldest first."""
    recs = []
    for path in sorted(Path(directory).rglob(results.FILENAME)):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        rec["out_dir"] = str(path.parent)
        recs.append(rec)
    return sorted(recs, key=lambda r: r.get("started_at", 0))


# ---- sync: upload results.json files logged nowhere ------------------------------------------------------
def sync(directory: Path, tracker: Tracker) -> tuple[int, int]:
    """Log every results.json under ``directory`` whose record id is not in the store yet.
    Returns (uploaded, already_there)."""
    uploaded = present = 0
    for rec in collect(directory):
        rid = rec.setdefault("record_id", os.urandom(8).hex())
        found = tracker.client.search_runs([tracker.experiment_id()], f"tags.`{RECORD_TAG}` = '{rid}'")
        if found:
            present += 1
            continue
        out_dir = Path(rec["out_dir"])
        run = tracker.client.create_run(tracker.experiment_id(), run_name=rec.get("name") or "defaults",
                                        tags={RECORD_TAG: rid, "spec_decode.role": rec["role"],
                                              "spec_decode.synced": "true"})
        rec["mlflow_run_id"] = run.info.run_id
        results.write(out_dir, rec)
        log_record(tracker.client, run.info.run_id, rec, out_dir)
        tracker.client.set_terminated(run.info.run_id, status=_status(rec["status"]))
        uploaded += 1
    return uploaded, present


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m spec_decode.tracking",
                                 description="Upload job results that never reached MLflow.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="log every results.json under DIR not yet in the store")
    s.add_argument("dir", type=Path)
    s.add_argument("--uri", default="sqlite:///mlflow.db")
    s.add_argument("--experiment", default="spec-decode-bench")
    s.add_argument("--artifact-location", default="mlartifacts")
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        ap.error(f"{args.dir}: not a directory")
    tracker = Tracker(args.uri, args.experiment, args.artifact_location, Path.cwd())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up, present = sync(args.dir, tracker)
    print(f"uploaded {up} run(s); {present} already in {tracker.uri}")


if __name__ == "__main__":
    main()
