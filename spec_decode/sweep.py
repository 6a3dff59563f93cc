"""The sweep's Hydra callback: the MLflow parent run of a multirun and the sweep summary.

``on_multirun_start`` opens the parent run and hands its id to each job (environment, so it also
reaches submitit/joblib workers); at the end (also on failure or Ctrl-C, via atexit) the summary table
and plots are rendered from the jobs' results.json files -- preflight-refused jobs included -- and the
parent closes FINISHED, FAILED (any job not FINISHED, or no job at all) or KILLED.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from . import results
from .report import sweep_summary, write_plots
from .tracking import PARENT_ENV, Tracker


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
        recs = results.collect(Path(self.sweep_dir))
        text, table = sweep_summary(recs)
        print(text, file=sys.stderr)
        Path(self.sweep_dir, "sweep_summary.txt").write_text(text + "\n")
        statuses = {r.status for r in recs}
        status = "KILLED" if "KILLED" in statuses else ("FAILED" if statuses - {"FINISHED"} else "FINISHED")
        if not recs:
            status = "FAILED"
        if self._tracker is not None and self.parent_run_id:
            c = self._tracker.client
            try:
                c.log_text(self.parent_run_id, text, "sweep_summary.txt")
                c.log_table(self.parent_run_id, table, "sweep_summary.json")
                for png in write_plots(recs, Path(self.sweep_dir)):
                    c.log_artifact(self.parent_run_id, str(png), artifact_path="plots")
            except Exception as e:  # noqa: BLE001 - the summary is a view; the status must still land
                print(f"warning: sweep summary not logged to MLflow: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                try:
                    c.set_terminated(self.parent_run_id, status=status)
                except Exception as e:  # noqa: BLE001
                    print(f"warning: could not close the MLflow parent run: {e}", file=sys.stderr)
