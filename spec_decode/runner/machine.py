"""The machine a job runs on, sampled by the runner (the record stores what these return, as read):

- ``fingerprint()``: CPU model, vendor, the ISA flags that change a CPU engine's speed (a summary, not the
  whole flag list), logical / physical cores, the cores this process may use, memory, kernel, whether a
  hypervisor is visible; where ``nvidia-smi`` exists, every GPU's name, driver, current and maximum SM
  clock, and the NCCL version torch loads. Never required: a missing source leaves its field None.
  It goes into the record's ``provenance.host`` (``runner.provenance.collect``).
- ``sample()`` / ``window(a, b)``: /proc/stat's CPU times and /proc/loadavg at the start and the end of a
  launch's timed runs -> the 1-minute load at both ends, and the shares of CPU time that were busy, stolen
  by the hypervisor (steal: another VM had our core) and waiting for I/O over the window (the record's
  ``launches[].host``; ``analysis.host.metrics_of`` sums them into the job's metrics), and at both ends
  the host probe: the time a fixed pure-Python task takes (``probe_us``), the host's own speed.
- ``tree_sample(pid)`` / ``tree_window(a, b)``: each process of a server's tree (the launcher and every
  descendant: SGLang's schedulers and detokenizer, our ranks) and its CPU time at both ends of the timed
  runs -> its CPU seconds and share of one core over them (``launches[].host.server_procs``): which process
  of the server works while it serves, the figure that says a server is bound by one of its host threads.
  Read from /proc between the runs, never inside one.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import psutil

from spec_decode.record.measured import HostWindow, ProcCpu

# The flags that decide which kernels a CPU engine (torch / oneDNN) can use; the rest is noise in a diff.
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)
# /proc/stat "cpu" line: user nice system idle iowait irq softirq steal (guest time is inside user)
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
GPU_QUERY = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem"


def _run(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_facts(cpuinfo: str) -> dict:
    """Model, vendor, ISA summary, physical cores and hypervisor flag from /proc/cpuinfo's text."""
    model = vendor = None
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    phys = core = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and model is None:
            model = value
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not key and phys is not None and core is not None:  # the blank line ending one processor
            cores.add((phys, core))
            phys = core = None
    if phys is not None and core is not None:
        cores.add((phys, core))
    return {
        "cpu_model": model,
        "cpu_vendor": vendor,
        "isa": [f for f in ISA_FLAGS if f in flags],
        "hypervisor": "hypervisor" in flags,
        "physical_cores": len(cores) or None,
    }


def gpu_facts() -> list[dict] | None:
    """One dict per GPU from nvidia-smi (None where there is none)."""
    out = _run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    if not out:
        return None
    keys = GPU_QUERY.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")))) for line in out.splitlines()]


@lru_cache(maxsize=1)
def fingerprint() -> dict:
    """What the host is (cached: it does not change within a process)."""
    try:
        cpu = cpu_facts(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = {
            "cpu_model": platform.processor() or None,
            "cpu_vendor": None,
            "isa": [],
            "hypervisor": None,
            "physical_cores": None,
        }
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = None
    gpus = gpu_facts()
    nccl = None
    if gpus:  # the NCCL torch loads; the runner does not import torch, so a child answers
        nccl = _run([sys.executable, "-c", "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))"])
    return {
        **cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mem_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
        "kernel": platform.release(),
        "gpus": gpus,
        "nccl_version": nccl,
    }


def probe_us(reps: int = 5) -> float:
    """How fast this process's code runs now: a fixed pure-Python task, the median of ``reps`` timings (µs,
    ~1 ms each: shorter than a scheduler slice, so it is the speed while running, not the share of the CPU,
    which load and steal are). A host that runs code slower for a while (a VM whose physical core is busy
    with another tenant's thread, a lower clock) shows as a larger number. The runner takes one at each end
    of a launch's timed runs, outside them."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        x = 0
        for i in range(20_000):
            x += i * i % 7
        times.append((time.perf_counter() - t) * 1e6)
    return round(sorted(times)[reps // 2], 1)


def sample() -> dict:
    """A point in time: the host probe (``probe_us``, taken first), monotonic time, the aggregate CPU times
    (ticks) and the load averages."""
    probe = probe_us()
    times: list[int] = []
    load: list[float] = []
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        times = [int(x) for x in first[1 : 1 + len(_FIELDS)]]
        load = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        pass
    return {"t": time.monotonic(), "cpu": times, "loadavg": load, "probe_us": probe}


def window(a: dict, b: dict) -> HostWindow:
    """How busy the host was between two samples (shares of all cores' time, in %)."""
    out = HostWindow(
        s=round(b["t"] - a["t"], 3),
        load1_start=a["loadavg"][0] if a["loadavg"] else None,
        load1_end=b["loadavg"][0] if b["loadavg"] else None,
        probe_us_start=a.get("probe_us"),
        probe_us_end=b.get("probe_us"),
    )
    if len(a["cpu"]) == len(b["cpu"]) == len(_FIELDS):
        d = dict(zip(_FIELDS, (y - x for x, y in zip(a["cpu"], b["cpu"]))))
        total = sum(d.values())
        if total > 0:
            out.busy_pct = round(100 * (total - d["idle"] - d["iowait"]) / total, 2)
            out.steal_pct = round(100 * d["steal"] / total, 2)
            out.iowait_pct = round(100 * d["iowait"] / total, 2)
    return out


def tree_sample(pid: int | None) -> dict:
    """The server tree rooted at ``pid`` now: {"t": monotonic time, "procs": {pid: (name, CPU
    seconds of its own threads (user + system), threads, its start as an epoch time)}}; the root is named
    "launcher" (SGLang's: HTTP + tokenizer manager; ours: the HTTP front), the others by their process name. A
    process that ends during the read is left out."""
    procs: dict[int, tuple[str, float, int, float]] = {}
    try:
        root = psutil.Process(pid) if pid is not None else None
        tree = [root, *root.children(recursive=True)] if root is not None else []
    except psutil.Error:
        tree = []
    for p in tree:
        try:
            with p.oneshot():
                t = p.cpu_times()
                name = "launcher" if p.pid == pid else proc_label(p.name(), p.cmdline)
                procs[p.pid] = (name, t.user + t.system, p.num_threads(), p.create_time())
        except psutil.Error:
            continue
    return {"t": time.monotonic(), "procs": procs}


def proc_label(name: str, cmdline) -> str:
    """A process's name in the CPU account: its own (a rank's ``rank0``, SGLang's ``sglang::scheduler``),
    or, for an interpreter that never named itself (``python3``), ``python:`` and what it runs, so that it
    cannot be summed with a process that named itself: ``-m pkg.mod`` -> ``python:pkg.mod``; a script ->
    ``python:<its stem>``, a package's ``.../compile_worker/__main__.py`` (torch.compile's worker pool) ->
    ``python:compile_worker``; ``-c "from multiprocessing.spawn import ..."`` -> ``python:mp.spawn``
    (multiprocessing's children and helpers); other ``-c`` code, stdin (``-``) or no arguments keep the
    name. ``cmdline`` is called only then (psutil's, or any callable)."""
    if not name.startswith("python"):
        return name
    try:
        argv = cmdline()
    except psutil.Error:
        return name
    i = 1
    while i < len(argv):  # the interpreter's own options, up to a script's path
        flag = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if flag.startswith("-m"):  # -m mod, or -mmod
            mod = flag[2:] or nxt
            return f"python:{mod}" if mod else name
        if flag.startswith("-c"):  # -c code, or -ccode
            m = re.match(r"\s*from\s+multiprocessing\.(\w+)\s+import", flag[2:] or nxt)
            return f"python:mp.{m.group(1)}" if m else name
        if flag in ("-", "--"):
            return name
        if not flag.startswith("-"):  # a script: its stem, or its package's name for a __main__.py
            path = Path(flag)
            label = path.parent.name if path.name == "__main__.py" else path.stem
            return f"python:{label}" if label else name
        i += 2 if flag in ("-W", "-X", "--check-hash-based-pycs") else 1
    return name


def tree_window(a: dict, b: dict) -> list[ProcCpu]:
    """Each process alive at ``b`` and its CPU time since ``a``, in seconds and in % of one core over the
    window: matched by pid and start time, so a pid the kernel reused in between is another process; one not
    in ``a`` started after it (a server's tree only grows from its launcher) and counts with all of its
    time. A process that ended in between is not counted."""
    s = b["t"] - a["t"]
    out = []
    for pid, (name, cpu, threads, created) in sorted(b["procs"].items()):
        before = a["procs"].get(pid)
        used = max(0.0, cpu - before[1]) if before is not None and before[3] == created else cpu
        out.append(ProcCpu(name, pid, round(used, 3), round(100 * used / s, 1) if s > 0 else 0.0, threads))
    return out
