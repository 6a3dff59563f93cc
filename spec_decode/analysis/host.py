"""The host's figures, derived from what the runner sampled (``runner.machine``): a job's load and steal
over its timed windows (``metrics_of``), each server process's CPU over them (``server_cpu``, said in one
line by ``describe_server_cpu``), and one line naming a fingerprint (``describe``);
``analysis.compare.host_differences`` names what differs between two fingerprints.
"""

from __future__ import annotations

import re

from spec_decode.record.measured import HostWindow, Launch
from spec_decode.record.runs import RunRecord


def metrics_of(windows: list[HostWindow]) -> dict[str, float]:
    """A job's host figures over its timed windows: mean and max 1-minute load (both ends of every
    window), steal and busy shares weighted by the windows' durations, mean and max host probe (µs)."""
    loads = [v for w in windows for v in (w.load1_start, w.load1_end) if v is not None]
    out: dict[str, float] = {}
    if loads:
        out["host_load1"] = sum(loads) / len(loads)
        out["host_load1_max"] = max(loads)
    timed = [w for w in windows if w.steal_pct is not None and w.s]
    if timed:
        total = sum(w.s for w in timed)
        out["host_steal_pct"] = sum(w.steal_pct * w.s for w in timed) / total
        out["host_busy_pct"] = sum(w.busy_pct * w.s for w in timed) / total
    probes = [v for w in windows for v in (w.probe_us_start, w.probe_us_end) if v is not None]
    if probes:  # the host's speed at both ends of the timed runs (larger: slower)
        out["host_probe_us"] = sum(probes) / len(probes)
        out["host_probe_us_max"] = max(probes)
    return out


def metric_name(process: str) -> str:
    """A process name as a metric key's suffix (MLflow's characters: ``sglang::scheduler_TP0`` ->
    ``sglang__scheduler_TP0``)."""
    return re.sub(r"[^\w.\-]", "_", process)


def server_cpu(launches: list[Launch], runs: list[RunRecord], baseline_runs: list[RunRecord]) -> dict[str, float]:
    """Each server process's CPU over the timed runs of all launches (``launches[].host.server_procs``,
    ``baseline_procs``), summed per process name: ``server_cpu_pct.<name>`` (% of one core over the timed
    windows) and ``server_cpu_ms_per_1k_tok.<name>`` (CPU ms per 1000 completion tokens of that server's
    timed runs), the same for the whole tree without the suffix; ``baseline_server_cpu_*`` for the paired
    baseline server. Launches recorded without the account add nothing."""
    out: dict[str, float] = {}
    for prefix, key, arm in (
        ("server_cpu", "server_procs", runs),
        ("baseline_server_cpu", "baseline_procs", baseline_runs),
    ):
        cpu: dict[str, float] = {}
        secs, tokens = 0.0, 0
        for x in launches:
            procs = getattr(x.host, key) if x.host is not None else None
            window = (x.host.procs_s or x.host.s) if x.host is not None else 0.0  # the reads' own window
            if not procs or not window:
                continue
            secs += window
            tokens += sum(r.completion_tokens for r in arm if r.launch == x.launch)
            for p in procs:  # per name as a metric key: two names that read alike there are summed
                name = metric_name(p.name)
                cpu[name] = cpu.get(name, 0.0) + p.cpu_s
        if not secs:
            continue
        for suffix, c in (("", sum(cpu.values())), *((f".{n}", c) for n, c in cpu.items())):
            out[f"{prefix}_pct{suffix}"] = 100 * c / secs
            if tokens:
                out[f"{prefix}_ms_per_1k_tok{suffix}"] = 1e6 * c / tokens
    return out


def as_baseline(metrics: dict[str, float]) -> dict[str, float]:
    """A baseline job's own ``server_cpu_*`` metrics as the spec job's ``baseline_server_cpu_*`` (what a
    paired baseline server's account gives), so either baseline strategy carries both servers'."""
    return {f"baseline_{k}": v for k, v in metrics.items() if k.startswith("server_cpu_")}


def server_cpu_items(metrics: dict[str, float], baseline: bool = False) -> str | None:
    """``rank0 99% (125 ms), launcher 41% (52 ms); all 140% (177 ms)``: each server process's share of one
    core over the timed runs and its CPU ms per 1k tokens, busiest first (None without the account)."""
    prefix = "baseline_server_cpu" if baseline else "server_cpu"
    if f"{prefix}_pct" not in metrics:
        return None

    def one(suffix: str) -> str:
        per = metrics.get(f"{prefix}_ms_per_1k_tok{suffix}")
        return f"{metrics[f'{prefix}_pct{suffix}']:.0f}%" + ("" if per is None else f" ({per:.0f} ms)")

    names = sorted(
        (k.split(".", 1)[1] for k in metrics if k.startswith(f"{prefix}_pct.")),
        key=lambda n: -metrics[f"{prefix}_pct.{n}"],
    )

    def idle(n: str) -> bool:  # what both figures would print as 0: counted, not named
        return metrics[f"{prefix}_pct.{n}"] < 0.5 and metrics.get(f"{prefix}_ms_per_1k_tok.{n}", 0.0) < 0.5

    shown = [n for n in names if not idle(n)]
    parts = [f"{n} {one('.' + n)}" for n in shown] + (
        [f"{len(names) - len(shown)} more idle (< 0.5% of a core each)"] if len(shown) < len(names) else []
    )
    return ", ".join(parts) + f"; all {one('')}"


def describe_server_cpu(metrics: dict[str, float], baseline: bool = False) -> str | None:
    """One console line: ``server_cpu_items`` with what it is."""
    items = server_cpu_items(metrics, baseline)
    who = "baseline server" if baseline else "server"
    return items and f"{who} CPU over the timed runs, % of one core (CPU ms per 1k tokens): {items}"


def describe(fp: dict | None) -> str:
    """One line: ``Intel Xeon ..., 2 cores (2 usable), avx2 fma avx512f; GPUs: ...``."""
    if not fp:
        return "host: unknown (recorded before the host fingerprint)"
    gpus = fp.get("gpus") or []
    gpu = (
        f"; {len(gpus)} x {gpus[0].get('name')} (driver {gpus[0].get('driver_version')}, SM "
        f"{gpus[0].get('clocks.sm')}/{gpus[0].get('clocks.max.sm')} MHz), NCCL {fp.get('nccl_version')}"
        if gpus
        else "; no GPU"
    )
    return (
        f"host: {fp.get('cpu_model')}, {fp.get('logical_cores')} cores ({fp.get('usable_cores')} usable), "
        f"ISA {' '.join(fp.get('isa') or []) or '?'}" + (", VM" if fp.get("hypervisor") else "") + gpu
    )
