"""The host's figures, derived from what the runner sampled (``runner.machine``): a job's load and steal
over its timed windows (``metrics_of``), and one line naming a fingerprint (``describe``);
``analysis.compare.host_differences`` names what differs between two fingerprints.
"""

from __future__ import annotations

from spec_decode.record.measured import HostWindow


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
