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


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="overhead_"))
    store = [f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_location={tmp}/art"]
    help_s = [timed(["--help"]) for _ in range(3)]
    rows = []
    for i in range(3):
        d = tmp / f"job{i}"
        wall = timed([*SMALL, *store, f"hydra.run.dir={d}"])
        rec = json.loads((d / "results.json").read_text())
        start = sum(x["server_start_s"] for x in rec["launches"])
        runs = sum(r["wall_s"] for r in rec["runs"])
        warm = runs / len(rec["runs"])  # one warmup request of the same shape
        rows.append({"wall_s": wall, "server_start_s": start, "timed_runs_s": runs, "warmup_s": warm,
                     "overhead_s": wall - start - runs - warm, "in_process_s": rec["ended_at"] - rec["started_at"]})
    print("| job | wall s | server start s | timed runs s | warmup s | harness overhead s |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i} | {r['wall_s']:.2f} | {r['server_start_s']:.2f} | {r['timed_runs_s']:.2f} | "
              f"{r['warmup_s']:.2f} | {r['overhead_s']:.2f} |")
    print(f"median harness overhead per single job: {statistics.median(r['overhead_s'] for r in rows):.2f} s "
          "(includes interpreter start-up, imports and MLflow store init, paid once per process)")
    sweep = tmp / "sweep"
    t_sweep = timed(["-m", "spec.steps=1,2,3,5", *SMALL, *store, f"hydra.sweep.dir={sweep}"])
    recs = [json.loads(p.read_text()) for p in sweep.rglob("results.json")]
    measured = sum(sum(x["server_start_s"] for x in r["launches"]) + sum(q["wall_s"] for q in r["runs"]) * 1.5
                   for r in recs)
    print(f"sweep of {len(recs)} jobs in one process: {t_sweep:.2f} s wall, "
          f"{(t_sweep - measured) / len(recs):.2f} s harness overhead per job (amortised)")
    print(f"python run.py --help: median {statistics.median(help_s):.2f} s")


if __name__ == "__main__":
    main()
