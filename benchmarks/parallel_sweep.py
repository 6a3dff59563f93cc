"""Wall time of a 4-job embedded sweep run one at a time vs two at a time on this machine.

    python benchmarks/parallel_sweep.py

Sequential: Hydra's basic launcher (one process). Parallel: hydra/launcher=local_parallel
(submitit_local, one process per job) with hardware.parallel_jobs=2 (the slot allocator lets two
servers run at once). Order alternates across repeats (AB BA).
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
SWEEP = [
    "-m",
    "spec.steps=1,2,3,5",
    "benchmark.max_new_tokens=200",
    "benchmark.runs=3",
    "benchmark.baseline_arm=false",
    "tracking=off",
]


def run(extra: list[str], d: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *SWEEP, *extra, f"hydra.sweep.dir={d}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    tps = [json.loads(p.read_text())["metrics"]["throughput_tok_s"] for p in d.rglob("results.json")]
    return wall, statistics.mean(tps)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="par_"))
    variants = {
        "sequential (basic launcher)": [],
        "2 at a time (submitit_local + slots)": [
            "hydra/launcher=local_parallel",
            "hardware.parallel_jobs=2",
            f"hardware.slots_dir={tmp / 'slots'}",
        ],
    }
    res = {k: [] for k in variants}
    names = list(variants)
    for rep in range(2):
        for name in names if rep % 2 == 0 else names[::-1]:
            res[name].append(run(variants[name], tmp / f"{rep}_{names.index(name)}"))
    print("| variant | sweep wall s (each repeat) | mean job tok/s |")
    print("|---|---|---|")
    for name, rows in res.items():
        print(f"| {name} | {', '.join(f'{w:.1f}' for w, _ in rows)} | {statistics.mean(t for _, t in rows):.0f} |")


if __name__ == "__main__":
    main()
