"""CPU seconds of a command and every process it starts, grouped by kind (issue 45's accounting).

    python benchmarks/suite_cpu.py -- python -m pytest -q -p no:cacheprovider
    python benchmarks/suite_cpu.py --json /tmp/suite_cpu.json --interval 0.2 -- python -m pytest -q tests/unit

Every ``--interval`` seconds it reads ``/proc/<pid>/stat`` of every process (one read each, parsed by
hand: psutil would read each file twice and cost the sampler more on a 2-core box) and keeps, for every
descendant of this sampler, its cmdline, ppid and last-seen utime+stime. The sampler makes itself a child
subreaper, so a process whose parent exits first (a daemon, a server left behind) stays a descendant; it
reads the final times of a zombie child before reaping it. What it misses: a process that starts and ends
between two polls, and the last interval of each process. The cross-check is the kernel's own total: the
sampler's ``RUSAGE_CHILDREN`` once the command and every orphan it reaped have ended (exact for every
process that was waited for; the table says how much the polls missed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
# a child whose own cmdline says nothing more (GENERIC) takes its parent's kind when it is one of these
# (mlflow's workers, Chromium's renderers); a spawn child of an embedded front is its rank
GENERIC = {"other python", "other", "mp spawn"}
INHERITED = {"mlflow", "dvc", "chromium", "sglang (contract)", "pip", "model build"}
PYTEST = re.compile(r"exec\(eval\(sys\.stdin|-m pytest")  # a pytest process: its own CPU is split by test
FRONTS = {"embedded front", "test launcher (front)"}


def kind_of(argv: list[str], parent_kind: str | None, is_top: bool) -> str:
    """The process kind of one cmdline (the rows of the table)."""
    if is_top:
        return "pytest (main)" if any("pytest" in a for a in argv) else "top"
    line = " ".join(argv)
    exe = Path(argv[0]).name if argv else ""
    words = [Path(a).name for a in argv[:3]]
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if module == "spec_decode.engines.embedded":
        own = "embedded front"
    elif module.startswith("spec_decode.engines.embedded."):
        own = "model build"
    elif {"fault_server.py", "rank_launcher.py"} & set(words):
        own = "test launcher (front)"
    elif "exec(eval(sys.stdin.readline()))" in line:
        own = "pytest (xdist worker)"
    elif "run.py" in words:
        own = "run.py"
    elif "multiprocessing.resource_tracker" in line:
        own = "mp resource tracker"
    elif "multiprocessing.spawn" in line:
        own = "mp spawn"
    elif "mlflow" in words or module.startswith("mlflow") or "gunicorn" in line or "uvicorn" in line:
        own = "mlflow"
    elif "dvc" in words:
        own = "dvc"
    elif exe == "git" or exe.startswith("git-"):
        own = "git"
    elif "sglang" in line:
        own = "sglang (contract)"
    elif "pip" in words or module == "pip":
        own = "pip"
    elif "chrom" in exe or "headless_shell" in exe or "playwright" in line:
        own = "chromium"
    elif "pytest" in words or module == "pytest":
        own = "pytest (nested)"
    elif module.startswith("spec_decode."):
        own = "spec_decode -m (other)"
    elif exe.startswith("python"):
        own = "other python"
    else:
        own = "other"
    if own == "mp spawn" and parent_kind in FRONTS:
        return "embedded rank"
    if own in GENERIC and parent_kind in INHERITED:
        return parent_kind
    return own


def normalise(argv: list[str]) -> str:
    """A cmdline with its temp paths, ports, ids and numbers folded, so repeats group together."""
    line = " ".join(argv).replace(sys.prefix, "<venv>").replace(str(Path.cwd()), ".")
    line = re.sub(r"/tmp/\S*", "<tmp>", line)
    line = re.sub(r"\b[0-9a-f]{16,}\b", "<id>", line)
    line = re.sub(r"\d+", "N", line)
    return line[:160]


def read_stat(pid: str) -> tuple[int, float, float, int] | None:
    """(ppid, utime+stime s, cutime+cstime s, starttime ticks) of ``pid``, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    f = raw[raw.rfind(b")") + 2 :].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK, int(f[19])


def read_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


class Sampler:
    def __init__(self, timelines: bool = False) -> None:
        self.timelines = timelines  # keep each pytest process's CPU over time (--tests)
        self.me = os.getpid()
        self.procs: dict[tuple[int, int], dict] = {}  # (pid, starttime) -> record
        self.current: dict[int, tuple[int, int]] = {}  # pid -> its latest key (pids are reused)
        self.top: tuple[int, int] | None = None
        self.polls = 0

    def poll(self) -> list[tuple[int, int]]:
        """One pass over /proc; the keys of the descendants alive (or not yet reaped) now."""
        self.polls += 1
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        stats = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit() and (s := read_stat(pid)) is not None:
                stats[int(pid)] = s
        children = defaultdict(list)
        for pid, s in stats.items():
            children[s[0]].append(pid)
        todo, seen = list(children[self.me]), []
        while todo:
            pid = todo.pop()
            seen.append(pid)
            todo.extend(children[pid])
        for pid in seen:
            ppid, cpu, ccpu, start = stats[pid]
            key = (pid, start)
            rec = self.procs.get(key)
            if rec is None:
                rec = self.procs[key] = {"pid": pid, "ppid": ppid, "start": start, "argv": [], "cpu_s": 0.0}
                rec["parent"] = self.current.get(ppid)
                self.current[pid] = key
            argv = read_cmdline(pid)
            if argv:  # a zombie's is empty: keep the last one; a forked child's changes at exec
                rec["argv"] = argv
            if self.timelines and PYTEST.search(" ".join(rec["argv"])) and cpu > rec["cpu_s"]:
                rec.setdefault("timeline", []).append((round(now, 2), cpu))  # to split its CPU by test
            rec["cpu_s"] = max(rec["cpu_s"], cpu)
            rec["children_cpu_s"] = ccpu
            rec["ppid"] = ppid
        return [self.current[pid] for pid in seen]

    @staticmethod
    def classify_all(records: list[dict], top: tuple[int, int] | None) -> None:
        """Each record's kind, parents first (a child may take its parent's)."""
        procs = {(r["pid"], r["start"]): r for r in records}
        for key in sorted(procs, key=lambda k: (procs[k]["start"], k[0])):
            rec = procs[key]
            parent = procs.get(tuple(rec["parent"])) if rec["parent"] else None
            rec["kind"] = kind_of(rec["argv"], parent and parent.get("kind"), key == top)


def reap(top_pid: int) -> int | None:
    """Reap every exited child (orphans included); the command's exit status once it has ended."""
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == top_pid:
            status = os.waitstatus_to_exitcode(code)


def loadavg() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)


def run(cmd: list[str], interval: float, grace: float = 5.0, testlog: Path | None = None) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    s = Sampler(timelines=testlog is not None)
    t0, busy0, load0 = time.monotonic(), busy_ticks(), loadavg()
    env = None
    if testlog:  # each test's start and end, from the plugin in every pytest process (workers included)
        testlog.unlink(missing_ok=True)
        here = str(Path(__file__).resolve().parent)
        env = {**os.environ, "SUITE_CPU_TESTLOG": str(testlog)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), here]))
        cmd = [*cmd, "-p", "suite_cpu_tests"]
    proc = subprocess.Popen(cmd, env=env)
    status = t_end = None
    loads = []
    while True:
        live = s.poll()
        if s.top is None:
            s.top = s.current.get(proc.pid)
        code = reap(proc.pid)
        if code is not None:
            status, t_end = code, time.monotonic()
        if t_end is not None:
            if not live or time.monotonic() - t_end > grace:
                break
        if s.polls % max(1, int(30 / interval)) == 0:
            loads.append(loadavg())
        time.sleep(interval)
    wall = t_end - t0
    busy1 = busy_ticks()
    Sampler.classify_all(list(s.procs.values()), s.top)
    kernel = resource.getrusage(resource.RUSAGE_CHILDREN)
    left = [s.procs[k]["argv"] for k in s.poll()]
    return {
        "cmd": cmd,
        "exit": status,
        "wall_s": wall,
        "interval_s": interval,
        "top": s.top,
        "polls": s.polls,
        "kernel_children_cpu_s": kernel.ru_utime + kernel.ru_stime,
        "sampler_cpu_s": sum(os.times()[:2]),
        "machine_busy_frac": (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
        "load_start": load0,
        "load_end": loadavg(),
        "loads_every_30s": loads,
        "still_running_at_end": left,
        "processes": list(s.procs.values()),
        "tests": [json.loads(line) for line in testlog.read_text().splitlines()] if testlog else [],
    }


def tables(res: dict, top_n: int = 15) -> str:
    procs = res["processes"]
    by_kind: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_line: dict[str, list] = defaultdict(lambda: [0.0, 0, ""])
    for p in procs:
        by_kind[p["kind"]][0] += p["cpu_s"]
        by_kind[p["kind"]][1] += 1
        g = by_line[normalise(p["argv"])]
        g[0] += p["cpu_s"]
        g[1] += 1
        g[2] = p["kind"]
    sampled = sum(v[0] for v in by_kind.values())
    out = [f"{'kind':<24} {'CPU s':>9} {'share':>6} {'procs':>6} {'s/proc':>7}"]
    for k, (cpu, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        out.append(f"{k:<24} {cpu:>9.1f} {cpu / max(sampled, 1e-9):>6.1%} {n:>6} {cpu / n:>7.2f}")
    kernel = res["kernel_children_cpu_s"]
    out += [
        f"{'sampled total':<24} {sampled:>9.1f}",
        f"kernel total (RUSAGE_CHILDREN of the sampler) {kernel:.1f} s: the polls missed {kernel - sampled:.1f} s",
        f"wall {res['wall_s']:.1f} s; CPU/wall {kernel / res['wall_s']:.2f} cores; machine busy "
        f"{res['machine_busy_frac']:.0%}; sampler itself {res['sampler_cpu_s']:.1f} s; exit {res['exit']}",
        f"load start {res['load_start']} end {res['load_end']}",
        "",
        f"top {top_n} command lines (normalised)",
        f"{'CPU s':>8} {'procs':>6}  {'kind':<22} cmdline",
    ]
    for line, (cpu, n, kind) in sorted(by_line.items(), key=lambda kv: -kv[1][0])[:top_n]:
        out.append(f"{cpu:>8.1f} {n:>6}  {kind:<22} {line}")
    if res.get("tests"):
        out += ["", per_test(res, top_n)]
    if res["still_running_at_end"]:
        out.append(f"still running at the end: {len(res['still_running_at_end'])} processes")
    return "\n".join(out)


def running(spans: list[tuple[float, float, str]], t: float) -> str:
    """The test that a pytest process ran at ``t``: the last to start by then (a process's start time has
    0.01 s ticks; a test's teardown may outlive its span by a poll)."""
    started = [s for s in spans if s[0] <= t + 0.05]
    return max(started)[2] if started else "(before the first test)"


def per_test(res: dict, top_n: int) -> str:
    """CPU of the processes each test started (with their descendants), by the test running on their
    pytest process when they started; the pytest processes' own CPU is not split."""
    spans = defaultdict(list)  # pytest pid -> [(t0, t1, nodeid)]
    open_ = {}
    for e in res["tests"]:
        if "start" in e:
            open_[(e["pid"], e["start"])] = e["t"]
        elif (e["pid"], e["end"]) in open_:
            spans[e["pid"]].append((open_.pop((e["pid"], e["end"])), e["t"], e["end"]))
    procs = {(p["pid"], p["start"]): p for p in res["processes"]}
    cpu = defaultdict(float)
    n = defaultdict(int)
    for p in procs.values():
        q = p
        while q and q["pid"] not in spans:  # up to the pytest process that started it
            q = procs.get(tuple(q["parent"])) if q["parent"] else None
        if q is None or q is p:
            continue
        t = p["start"] / TICK
        test = running(spans[q["pid"]], t)
        cpu[test] += p["cpu_s"]
        n[test] += 1
    own = defaultdict(float)  # the pytest processes' own CPU, each poll's increase to the test then running
    for p in procs.values():
        last = 0.0
        for t, c in p.get("timeline", []):
            test = running(spans.get(p["pid"], []), t)
            own[test] += c - last
            last = c
    for test, c in own.items():
        cpu[test] += c
    out = [
        f"top {top_n} tests by CPU: their pytest process's own (split by poll) and the processes they started",
        f"{'CPU s':>8} {'own s':>7} {'procs':>6}  test",
    ]
    for test, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:top_n]:
        out.append(f"{c:>8.1f} {own[test]:>7.1f} {n[test]:>6}  {test}")
    out.append(f"{sum(cpu.values()):>8.1f} {sum(own.values()):>7.1f} {sum(n.values()):>6}  (all tests)")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write every process's record and the totals here")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between polls of /proc")
    ap.add_argument("--top", type=int, default=15, help="how many command lines to list")
    ap.add_argument(
        "--tests",
        type=Path,
        metavar="LOG",
        help="a pytest command: log each test's span here "
        "(plugin suite_cpu_tests) and give each test the CPU of the processes it started",
    )
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the tables of an earlier --json; run nothing")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    a = ap.parse_args()
    if a.report:
        res = json.loads(a.report.read_text())
        for p in res["processes"]:
            p["parent"] = tuple(p["parent"]) if p["parent"] else None
        Sampler.classify_all(res["processes"], tuple(res["top"]) if res.get("top") else None)
        print(tables(res, a.top))
        return 0
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command (python benchmarks/suite_cpu.py -- COMMAND ...)")
    res = run(cmd, a.interval, testlog=a.tests)
    print(tables(res, a.top), file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return res["exit"] or 0


if __name__ == "__main__":
    sys.exit(main())
