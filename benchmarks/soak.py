"""Soak: a 30-job embedded sweep in which every 5th server is killed mid-run.

    python benchmarks/soak.py            # ~2-3 minutes on 2 cores

Expect 24 FINISHED jobs, 6 FAILED ones (runs measured before the kill kept), one parent run FAILED,
and no process of any server tree left behind (checked with psutil).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="soak_"))
    marker = f"soak{time.time_ns()}"
    args = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "benchmark.prompt_index=0,1,2,3,4,5,6,7,0,1,2,3,4,5,6",
        "spec.steps=1,3",
        "benchmark.max_new_tokens=32",
        "benchmark.runs=3",
        "benchmark.warmup=1",
        "benchmark.baseline_arm=false",
        "engine.launcher=[python,tests/fault_server.py]",
        "+engine.env.FAULT=every:5:die_on_request:3",
        f"+engine.env.FAULT_COUNTER={tmp / 'counter'}",
        "+engine.env.FAULT_GRANDCHILD=1",
        f"+engine.env.FAULT_MARKER={marker}",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"tracking.artifact_location={tmp}/art",
        f"hydra.sweep.dir={tmp / 'sweep'}",
    ]
    t0 = time.perf_counter()
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    recs = [json.loads(f.read_text()) for f in (tmp / "sweep").rglob("results.json")]
    status = {s: sum(r["status"] == s for r in recs) for s in ("FINISHED", "FAILED", "KILLED")}
    kept = sum(len(r["runs"]) for r in recs if r["status"] == "FAILED")
    time.sleep(1)
    left = [q.pid for q in psutil.process_iter() if _has(q, marker)]
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    runs = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id], max_results=100)
    by = {}
    for r in runs:
        by[(r.data.tags.get("spec_decode.role"), r.info.status)] = (
            by.get((r.data.tags.get("spec_decode.role"), r.info.status), 0) + 1
        )
    print(
        f"soak: {len(recs)} jobs in {wall:.0f} s (exit code {p.returncode}); {status}; "
        f"runs kept from failed jobs: {kept}; MLflow runs by (role, status): {by}; leftover processes: {left}"
    )


def _has(q: psutil.Process, marker: str) -> bool:
    try:
        return q.environ().get("FAULT_MARKER") == marker
    except (psutil.Error, OSError):
        return False


if __name__ == "__main__":
    main()
