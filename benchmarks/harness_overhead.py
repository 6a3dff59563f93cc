"""Harness overhead per job: our own work, not the servers'.

    python benchmarks/harness_overhead.py            # --help x3, 3 single jobs, 1 sweep of 8; tiny settings

The jobs run the default baseline strategy (paired: each spec job starts its own server and a baseline
server beside it). Each `python run.py` runs through this script (`--job`), which times (the real calls,
only timed: HOOKS) every call that waits on a server -- `ServerProcess.start` (launch + health),
`ServerProcess.stop` (drain, kill, reap), `Client.generate` (warmup, timed runs of both arms, the
profiled pass), `Client.flush_cache`, `Client.server_info` -- and a few of our own steps, and appends each
span to a file. A job's harness overhead is its time minus the union of the server spans: Python, Hydra,
preflight, provenance, MLflow, the record's sections, results.json, the sweep callback's per-job work,
our own waits between requests. Inside a sweep a job's time runs from the previous job's end to its own
end (Hydra's per-job set-up included); the first job, which also pays the once-per-sweep start-up, is
left out of the median. The run.py process's CPU time per job is printed too: it does not grow with the
machine's load as much as wall time does (but it includes the client's side of the requests and the
polling while servers start and stop).

The slot pool is the run's own (SPEC_DECODE_SLOTS_DIR in a temp dir): on a shared machine, jobs of other
sessions hold the machine-wide CPU slots and a job would time their runs as its own wait (32 s per job
on 2026-12-01, in the first run of this script's previous version).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["benchmark.max_new_tokens=32", "benchmark.runs=2", "benchmark.warmup=1"]
SPANS = "HARNESS_OVERHEAD_SPANS"  # the file a --job process appends its spans to


# (module, attribute) -> what the span counts as: the calls that wait on a server ("server"), the job
# itself ("job": the CPU clock at its end), and our own larger steps ("ours", for the breakdown).
HOOKS = {
    ("spec_decode.runner.server", "ServerProcess.start"): "server",  # launch + health
    ("spec_decode.runner.server", "ServerProcess.stop"): "server",  # drain, kill, reap
    ("spec_decode.runner.client", "Client.generate"): "server",  # warmup, timed runs, profiled pass
    ("spec_decode.runner.client", "Client.flush_cache"): "server",
    ("spec_decode.runner.client", "Client.server_info"): "server",
    ("spec_decode.runner.cli", "run_from_hydra"): "job",
    ("spec_decode.runner.preflight", "run"): "ours",
    ("spec_decode.runner.recording", "new_record"): "ours",
    ("spec_decode.views.tracking", "Tracker.start"): "ours",
    ("spec_decode.runner.doctor", "warmup_checks"): "ours",
    ("spec_decode.runner.recording", "finish"): "ours",
    ("spec_decode.record.results", "write"): "ours",
    ("spec_decode.views.tracking", "Tracker.finish"): "ours",
}


def _timed_span(kind: str, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0, c0 = time.time(), time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            with open(os.environ[SPANS], "a") as f:
                f.write(json.dumps([kind, name, t0, time.time(), c0, time.process_time()]) + "\n")

    return wrapper


def job_main(args: list[str]) -> None:
    """`python run.py args`, with the HOOKS timed (the real calls, only timed)."""
    sys.path.insert(0, str(ROOT))
    for (module, attr), kind in HOOKS.items():
        owner = importlib.import_module(module)
        *cls, name = attr.split(".")
        if cls:
            owner = getattr(owner, cls[0])
        setattr(owner, name, _timed_span(kind, attr, getattr(owner, name)))
    sys.argv = [str(ROOT / "run.py"), *args]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")


def run(args: list[str], spans: Path | None, slots: Path) -> float:
    """Wall time of one `python run.py args` (through --job with ``spans``: its spans appended there)."""
    env = {**os.environ, SPANS: str(spans), "SPEC_DECODE_SLOTS_DIR": str(slots)}
    cmd = [__file__, "--job"] if spans else [str(ROOT / "run.py")]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run.py {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def busy_s(spans: list[list], lo: float, hi: float) -> float:
    """Seconds within [lo, hi] covered by at least one server span (the paired arms may overlap)."""
    total, end = 0.0, lo
    for _, _, a, b, *_ in sorted((x for x in spans if x[0] == "server"), key=lambda x: x[2]):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total, end = total + b - a, b
    return total


def in_window(spans: list[list], kind: str, lo: float, hi: float) -> list[list]:
    return [x for x in spans if x[0] == kind and lo < x[3] <= hi]


def read_spans(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="overhead_"))
    slots = tmp / "slots"
    store = [f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_location={tmp}/art"]
    load0 = os.getloadavg()
    help_s = [run(["--help"], None, slots) for _ in range(3)]
    singles = []
    for i in range(3):
        d, spans = tmp / f"job{i}", tmp / f"job{i}.spans"
        t0 = time.time()
        wall = run([*SMALL, *store, f"hydra.run.dir={d}"], spans, slots)
        s = read_spans(spans)
        job = in_window(s, "job", t0, time.time())[-1]
        singles.append(
            {
                "overhead": wall - busy_s(s, t0, time.time()),
                "cpu": job[5],
                "in_job": job[3] - job[2] - busy_s(s, job[2], job[3]),
            }
        )
    sweep, spans = tmp / "sweep", tmp / "sweep.spans"
    t_start = time.time()
    t_sweep = run(["-m", "spec.steps=1,2,3,5,1,2,3,5", *SMALL, *store, f"hydra.sweep.dir={sweep}"], spans, slots)
    t_end = time.time()
    s = read_spans(spans)
    recs = [json.loads(p.read_text()) for p in sweep.glob("*/results.json")]
    bad = [r["name"] for r in recs if r["status"] != "FINISHED"]
    jobs = sorted(in_window(s, "job", t_start, t_end), key=lambda x: x[3])
    if bad or len(recs) != 8 or len(jobs) != 8:
        raise SystemExit(f"the sweep did not finish 8 jobs: {len(recs)} records, not FINISHED: {bad}")
    per_job, cpu, servers, phases = [], [], [], {}
    for prev, job in zip(jobs, jobs[1:]):  # job i: from job i-1's end to its own end
        lo, hi = prev[3], job[3]
        per_job.append(hi - lo - busy_s(s, lo, hi))
        cpu.append(job[5] - prev[5])
        servers.append(sum(x[1] == "ServerProcess.start" for x in in_window(s, "server", lo, hi)))
        for name in {x[1] for x in s if x[0] == "ours"}:
            phases.setdefault(name, []).append(sum(x[3] - x[2] for x in in_window(s, "ours", lo, hi) if x[1] == name))
    load1 = os.getloadavg()
    med = statistics.median
    print(
        f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} before, "
        f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} after; {os.cpu_count()} CPUs"
    )
    print(
        f"servers started per job: sweep {sorted(set(servers))}, single jobs "
        f"{sorted({sum(x[1] == 'ServerProcess.start' for x in read_spans(tmp / f'job{i}.spans')) for i in range(3)})}"
    )
    print("| what | seconds |")
    print("|---|---|")
    print(
        f"| **harness overhead per job inside a sweep** (median of jobs 2..{len(jobs)}: the previous job's end "
        f"to its end minus the server spans) | **{med(per_job):.2f}** |"
    )
    print(
        f"| CPU time of the run.py process per sweep job (median; also the client side of the requests and "
        f"the polling while servers start and stop) | {med(cpu):.2f} |"
    )
    for name, v in sorted(phases.items(), key=lambda kv: -med(kv[1])):
        print(f"| - of which `{name}` (median) | {med(v):.3f} |")
    print(
        f"| sweep: start to the first job's end, minus server spans (imports, store, parent run) | "
        f"{jobs[0][3] - t_start - busy_s(s, t_start, jobs[0][3]):.2f} |"
    )
    print(f"| sweep: after the last job (summary, recommendation, A/A control, charts) | {t_end - jobs[-1][3]:.2f} |")
    print(
        f"| single `python run.py` job: wall minus server spans (median of 3) | {med(x['overhead'] for x in singles):.2f} |"
    )
    print(
        f"| single job: inside run_from_hydra, minus server spans (median of 3) | {med(x['in_job'] for x in singles):.2f} |"
    )
    print(f"| single job: CPU time of the process (median of 3) | {med(x['cpu'] for x in singles):.2f} |")
    print(f"| `python run.py --help` (median of 3) | {med(help_s):.2f} |")
    print(f"(sweep wall {t_sweep:.1f} s; server spans {busy_s(s, t_start, t_end):.1f} s; dir {tmp})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job_main(sys.argv[2:])
    else:
        main()
