"""CPU seconds of our Python processes with and without frozen imports (spec_decode/core/gc_imports.py),
for one or more source trees, interleaved.

    git archive HEAD~1 | tar -x -C /tmp/before                  # (the tree before the change)
    python benchmarks/gc_imports.py --tree before=/tmp/before --tree after=. --repeats 5

Each repeat runs, per tree in turn (ABAB...: machine noise hits both alike), the processes a sweep and
its reports start most often:

- ``job``: ``run.py`` with one small embedded job (48 tokens, 2 runs), tracking into a fresh sqlite
  store (MLflow imported, the store created, the record logged);
- ``dry``: ``run.py dry_run=true`` (Hydra's composition, the preflight; no MLflow);
- ``report``: ``python -m spec_decode.views.experiment compare`` of ci_smoke's committed metrics
  with themselves (scipy, the intervals).

``own_cpu_s`` is the process's own user + system time over its whole life, its interpreter's
finalization included: read from ``/proc/<pid>/stat`` once it has exited and before it is reaped
(``waitid(WNOWAIT)``); its children's (the server, its ranks) are not in it. The table gives medians
and the after/before ratio per process. Every tree runs with its own directory first on the path (its
run.py's directory; ``PYTHONPATH`` for ``-m``), the models are this checkout's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def own_cpu(argv: list[str], cwd: Path, env: dict) -> tuple[float, int]:
    """(user + system seconds of the process itself, exit code)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: /proc still has it
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)
    err = proc.stderr.read().decode(errors="replace")
    proc.wait()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{err[-2000:]}")
    return cpu, proc.returncode


def commands(tree: Path, tmp: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "job": [
            py,
            str(tree / "run.py"),
            "benchmark.max_new_tokens=48",
            "benchmark.runs=2",
            "benchmark.warmup=1",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            f"tracking.artifact_location={tmp}/mlartifacts",
            f"hydra.run.dir={tmp}/job",
            f"model.path={ROOT}/models/tiny/target",
            f"drafter.path={ROOT}/models/tiny/drafter",
        ],
        "dry": [py, str(tree / "run.py"), "dry_run=true", "tracking=off", f"hydra.run.dir={tmp}/dry"],
        "report": [
            py,
            "-m",
            "spec_decode.views.experiment",
            "compare",
            str(ROOT / "experiments/ci_smoke/metrics.json"),
            str(ROOT / "experiments/ci_smoke/metrics.json"),
        ],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=None, help="NAME=DIR (default: this=.), repeatable")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default=None, help="comma-separated: job,dry,report")
    args = ap.parse_args(argv)
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in (args.tree or ["this=."])]
    cpu: dict[tuple[str, str], list[float]] = {}
    for i in range(args.repeats):
        for name, tree in trees:
            env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
            with tempfile.TemporaryDirectory() as tmp:
                cmds = commands(tree, Path(tmp))
                for what in args.only.split(",") if args.only else cmds:
                    s, _ = own_cpu(cmds[what], tree, env)
                    cpu.setdefault((what, name), []).append(s)
                    print(f"repeat {i + 1} {name:>8} {what:>6} {s:6.2f} s", file=sys.stderr, flush=True)
    whats = list(dict.fromkeys(w for w, _ in cpu))
    print(f"| process | {' | '.join(f'{n} own CPU s (median of {args.repeats})' for n, _ in trees)} | ratio |")
    print(f"|---|{'---|' * len(trees)}---|")
    for what in whats:
        meds = [statistics.median(cpu[(what, n)]) for n, _ in trees]
        ratio = f"{meds[-1] / meds[0]:.2f}" if len(meds) > 1 else ""
        print(f"| {what} | {' | '.join(f'{m:.3f}' for m in meds)} | {ratio} |")


if __name__ == "__main__":
    main()
