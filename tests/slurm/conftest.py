"""The slurm tier runs sweeps through a real SLURM cluster (sbatch, squeue, scancel); `.ci/slurm-up.sh`
starts a single-node one. Without SLURM the tier skips locally; in CI (CI=true, or
SPEC_DECODE_REQUIRE_SLURM=1 which .ci/run sets) it fails: the tier must never skip silently."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import ROOT


def _slurm_missing() -> str | None:
    """Why SLURM cannot take jobs here, or None when it can."""
    for tool in ("sbatch", "squeue", "scancel", "scontrol", "sinfo"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
        if "is UP" not in ping.stdout:
            return f"slurmctld not answering (scontrol ping: {(ping.stdout + ping.stderr).strip()!r})"
        states = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"SLURM tools fail: {e}"
    if not any(s.rstrip("*") in {"idle", "mixed", "allocated", "completing"} for s in states):
        return f"no node takes jobs (sinfo node states: {states})"
    return None


def _required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("SPEC_DECODE_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="session")
def slurm() -> None:
    why = _slurm_missing()
    if why is None:
        return
    hint = "start a single-node cluster with `sudo bash .ci/slurm-up.sh`"
    if _required():
        pytest.fail(f"SLURM is not up ({why}); CI must run the slurm tier: {hint}")
    pytest.skip(f"SLURM is not up ({why}); {hint}")


@pytest.fixture
def job_name(slurm, request) -> str:
    """A unique SLURM job name for this test's sweep; its jobs are cancelled at teardown, so a failed
    test never leaves jobs that block the next one."""
    name = f"sdb-{request.node.name[:24]}-{time.time_ns() % 10**9}"
    yield name
    subprocess.run(["scancel", "--name", name], capture_output=True, timeout=30)


def slurm_sweep(*overrides: str, job_name: str, sweep_dir: Path, slots_dir: Path) -> list[str]:
    """The argv (after run.py) of a sweep on SLURM with the CPU preset, bounded for CI. Unpaired: the
    tier tests the baseline job shared through the sweep dir (a paired job co-hosts its own)."""
    return [
        "-m",
        "hydra/launcher=slurm_cpu",
        f"hydra.launcher.name={job_name}",
        "benchmark.max_new_tokens=32",
        "benchmark.runs=2",
        "benchmark.warmup=1",
        "benchmark.paired=false",
        f"hardware.slots_dir={slots_dir}",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]


def squeue(job_name: str) -> list[tuple[str, str]]:
    """(job id, state) of this name's jobs still known to SLURM, array tasks one per row."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "--name", job_name, "-o", "%i %T"], capture_output=True, text=True, timeout=30
    ).stdout
    return [tuple(line.split()[:2]) for line in out.splitlines() if line.strip()]


__all__ = ["ROOT", "slurm_sweep", "squeue"]
