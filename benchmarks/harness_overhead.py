"""Harness overhead per job: everything except the server's start and the timed decode.

    python benchmarks/harness_overhead.py            # 3 single jobs + 1 sweep of 2, tiny settings

For each job: wall time of `python run.py ...` minus server start (results.json launches[].server_start_s)
minus the timed runs (sum of runs[].wall_s) minus warmup requests. The remainder is ours: Python
start-up and imports, Hydra composition, preflight, MLflow logging, results.json, teardown. Also times
`python run.py --help`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["benchmark.max_new_tokens=32", "benchmark.runs=2", "benchmark.warmup=1", "benchmark.baseline_arm=false"]


def timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def job_overhead(rec: dict) -> float:
    """In-process time of a job minus server start, warmup and timed requests: what the harness adds."""
    busy = sum(x["server_start_s"] + x.get("warmup_s", 0.0) for x in rec["launches"])
    busy += sum(r["wall_s"] for r in rec["runs"])
    return rec["ended_at"] - rec["started_at"] - busy


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="overhead_"))
    store = [f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_location={tmp}/art"]
    help_s = [timed(["--help"]) for _ in range(3)]
    singles = []
    for i in range(3):
        d = tmp / f"job{i}"
        wall = timed([*SMALL, *store, f"hydra.run.dir={d}"])
        rec = json.loads((d / "results.json").read_text())
        singles.append((wall, job_overhead(rec), rec))
    sweep = tmp / "sweep"
    t_sweep = timed(["-m", "spec.steps=1,2,3,5,1,2,3,5", *SMALL, *store, f"hydra.sweep.dir={sweep}"])
    recs = [json.loads(p.read_text()) for p in sweep.rglob("results.json")]
    per_job = [job_overhead(r) for r in recs]
    in_jobs = sum(r["ended_at"] - r["started_at"] for r in recs)
    print("| what | seconds |")
    print("|---|---|")
    print(f"| harness overhead per job inside a sweep (median of {len(recs)}; preflight, provenance, "
          f"MLflow run + logging, results.json, teardown) | {statistics.median(per_job):.2f} |")
    print(f"| same, single `python run.py` jobs (median of 3) | {statistics.median(o for _, o, _ in singles):.2f} |")
    print(f"| single job: process wall minus in-job time (interpreter, imports, Hydra, MLflow store init) | "
          f"{statistics.median(w - (r['ended_at'] - r['started_at']) for w, _, r in singles):.2f} |")
    print(f"| sweep of {len(recs)}: wall minus in-job time (once per sweep: imports, store init, parent run, "
          f"summary + plots) | {t_sweep - in_jobs:.2f} |")
    print(f"| `python run.py --help` (median of 3) | {statistics.median(help_s):.2f} |")


if __name__ == "__main__":
    main()
