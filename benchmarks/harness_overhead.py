"""Harness overhead per job: our own work, not the servers'.

    python benchmarks/harness_overhead.py            # --help x3, 3 single jobs, sweeps of 8: empty, real, empty
    python benchmarks/harness_overhead.py --sweeps-only   # the sweeps only (what the last line needs)

The last line is machine-readable: ``overhead_per_sweep_job_s=<float>``, the harness's work per sweep job
(a real job's time minus its server spans) less what an *empty* job costs in the same sweep (Hydra's
per-job compose and launch, the sweep callback: ``run_from_hydra`` replaced by a function that returns at
once). The empty sweeps run just before and just after the real one (interleaved: the machine's load
drifts in between, and their mean takes the drift out to first order).

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
    ("spec_decode.engines.server_process", "ServerProcess.start"): "server",  # launch + health
    ("spec_decode.engines.server_process", "ServerProcess.stop"): "server",  # drain, kill, reap
    ("spec_decode.runner.client", "Client.generate"): "server",  # warmup, timed runs, profiled pass
    ("spec_decode.runner.client", "Client.flush_cache"): "server",
    ("spec_decode.runner.client", "Client.server_info"): "server",
    ("spec_decode.hydra_entry", "run_from_hydra"): "job",
    ("spec_decode.runner.preflight", "run"): "ours",
    ("spec_decode.runner.job", "new_record"): "ours",  # runner.context.new_record, as job calls it
    ("spec_decode.views.tracking", "Tracker.start"): "ours",
    ("spec_decode.runner.doctor", "warmup_checks"): "ours",
    ("spec_decode.runner.job", "finish"): "ours",  # analysis.finish.finish, as job calls it
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


def job_main(args: list[str], empty: bool = False) -> None:
    """`python run.py args`, with the HOOKS timed (the real calls, only timed); ``empty``: every job returns
    at once (Hydra, the sweep callback and the job's span stay)."""
    sys.path.insert(0, str(ROOT))
    if empty:
        importlib.import_module("spec_decode.hydra_entry").run_from_hydra = lambda cfg: None
    for (module, attr), kind in HOOKS.items():
        owner = importlib.import_module(module)
        *cls, name = attr.split(".")
        if cls:
            owner = getattr(owner, cls[0])
        setattr(owner, name, _timed_span(kind, attr, getattr(owner, name)))
    sys.argv = [str(ROOT / "run.py"), *args]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")


def run(args: list[str], spans: Path | None, slots: Path, empty: bool = False) -> float:
    """Wall time of one `python run.py args` (through --job with ``spans``: its spans appended there)."""
    env = {**os.environ, SPANS: str(spans), "SPEC_DECODE_SLOTS_DIR": str(slots)}
    cmd = [__file__, "--empty-job" if empty else "--job"] if spans else [str(ROOT / "run.py")]
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


SWEEP = ["-m", "spec.steps=1,2,3,5,1,2,3,5"]


def sweep(tmp: Path, name: str, slots: Path, store: list[str], empty: bool) -> dict:
    """One sweep of 8 jobs: per steady job (2..8, from the previous job's end to its own end) the time
    outside server spans, the run.py process's CPU, the servers it started and our larger steps."""
    d, spans = tmp / name, tmp / f"{name}.spans"
    t_start = time.time()
    wall = run([*SWEEP, *SMALL, *store, f"hydra.sweep.dir={d}"], spans, slots, empty)
    t_end = time.time()
    s = read_spans(spans)
    jobs = sorted(in_window(s, "job", t_start, t_end), key=lambda x: x[3])
    recs = [json.loads(p.read_text()) for p in d.glob("*/results.json")]
    bad = [r["name"] for r in recs if r["status"] != "FINISHED"]
    if len(jobs) != 8 or (not empty and (bad or len(recs) != 8)):
        raise SystemExit(
            f"sweep {name} did not finish 8 jobs: {len(jobs)} jobs, {len(recs)} records, not FINISHED: {bad}"
        )
    out = {"per_job": [], "cpu": [], "servers": [], "phases": {}, "wall": wall, "busy": busy_s(s, t_start, t_end)}
    for prev, job in zip(jobs, jobs[1:]):  # job i: from job i-1's end to its own end
        lo, hi = prev[3], job[3]
        out["per_job"].append(hi - lo - busy_s(s, lo, hi))
        out["cpu"].append(job[5] - prev[5])
        out["servers"].append(sum(x[1] == "ServerProcess.start" for x in in_window(s, "server", lo, hi)))
        for n in {x[1] for x in s if x[0] == "ours"}:
            out["phases"].setdefault(n, []).append(sum(x[3] - x[2] for x in in_window(s, "ours", lo, hi) if x[1] == n))
    out["first"] = jobs[0][3] - t_start - busy_s(s, t_start, jobs[0][3])
    out["after"] = t_end - jobs[-1][3]
    return out


def main(sweeps_only: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="overhead_"))
    slots = tmp / "slots"
    store = [f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_location={tmp}/art"]
    med = statistics.median
    load0 = os.getloadavg()
    help_s, singles = [], []
    if not sweeps_only:
        help_s = [run(["--help"], None, slots) for _ in range(3)]
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
                    "servers": sum(x[1] == "ServerProcess.start" for x in s),
                }
            )
    # interleaved: empty, real, empty (the empty sweeps' mean is the reference at the real one's load)
    empty_before = sweep(tmp, "empty1", slots, store, empty=True)
    real = sweep(tmp, "sweep", slots, store, empty=False)
    empty_after = sweep(tmp, "empty2", slots, store, empty=True)
    load1 = os.getloadavg()
    real_s = med(real["per_job"])
    empty_s = (med(empty_before["per_job"]) + med(empty_after["per_job"])) / 2
    print(
        f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} before, "
        f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} after; {os.cpu_count()} CPUs"
    )
    print(
        f"servers started per job: sweep {sorted(set(real['servers']))}, empty sweeps "
        f"{sorted(set(empty_before['servers'] + empty_after['servers']))}"
        + (f", single jobs {sorted({x['servers'] for x in singles})}" if singles else "")
    )
    print("| what | seconds |")
    print("|---|---|")
    print(
        "| **harness overhead per sweep job, less an empty job** (the two rows below: the last line) | "
        f"**{real_s - empty_s:.2f}** |"
    )
    print(
        "| per sweep job, real (median of jobs 2..8: the previous job's end to its end minus the server "
        f"spans) | {real_s:.2f} |"
    )
    print(
        "| per sweep job, empty (run_from_hydra returns at once; median of jobs 2..8, before / after) | "
        f"{empty_s:.2f} ({med(empty_before['per_job']):.2f} / {med(empty_after['per_job']):.2f}) |"
    )
    print(
        f"| CPU time of the run.py process per sweep job (median; also the client side of the requests and "
        f"the polling while servers start and stop) | {med(real['cpu']):.2f} |"
    )
    for name, v in sorted(real["phases"].items(), key=lambda kv: -med(kv[1])):
        print(f"| - of which `{name}` (median) | {med(v):.3f} |")
    print(
        f"| sweep: start to the first job's end, minus server spans (imports, store, parent run) | {real['first']:.2f} |"
    )
    print(f"| sweep: after the last job (summary, recommendation, A/A control, charts) | {real['after']:.2f} |")
    if singles:
        print(
            f"| single `python run.py` job: wall minus server spans (median of 3) | {med(x['overhead'] for x in singles):.2f} |"
        )
        print(
            f"| single job: inside run_from_hydra, minus server spans (median of 3) | {med(x['in_job'] for x in singles):.2f} |"
        )
        print(f"| single job: CPU time of the process (median of 3) | {med(x['cpu'] for x in singles):.2f} |")
        print(f"| `python run.py --help` (median of 3) | {med(help_s):.2f} |")
    print(f"(sweep wall {real['wall']:.1f} s; server spans {real['busy']:.1f} s; dir {tmp})")
    print(f"overhead_per_sweep_job_s={real_s - empty_s:.4f}")


if __name__ == "__main__":
    if sys.argv[1:2] in (["--job"], ["--empty-job"]):
        job_main(sys.argv[2:], empty=sys.argv[1] == "--empty-job")
    else:
        main(sweeps_only="--sweeps-only" in sys.argv[1:])
