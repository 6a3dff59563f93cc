"""``python -m spec_decode.views.tracking sync DIR`` (or ``spec-decode sync DIR``): log every results.json
under DIR that never reached the MLflow store (idempotent: runs are matched by record id)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from spec_decode.core import store
from spec_decode.record import results
from spec_decode.views.mlflow_run import LOGGED_TAG, RECORD_TAG, display_name, log_record, run_status
from spec_decode.views.tracking import Tracker


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.views.tracking", description="Upload job results that never reached MLflow."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="log every results.json under DIR not yet in the store")
    s.add_argument("dir", type=Path)
    s.add_argument("--uri", default=None, help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    s.add_argument("--experiment", default="spec-decode-bench")
    s.add_argument("--artifact-location", default="mlartifacts")
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        ap.error(f"{args.dir}: not a directory")
    tracker = Tracker(store.store_uri(args.uri), args.experiment, args.artifact_location, Path.cwd())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up, present = sync(args.dir, tracker)
    print(f"uploaded {up} run(s); {present} already in {tracker.uri}")


if __name__ == "__main__":
    main()
