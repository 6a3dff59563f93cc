"""The GPU session kit keeps what a call writes under $OUT to what the device tool returns (8 files):
benchmarks/gpu/session.sh's own ``fold_out``, run by bash on real files (a ninth file once made the tool
drop a sweep's archive, docs/gpu-session-2026-12-04.md)."""

import re
import subprocess

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "benchmarks" / "gpu" / "session.sh"


def fold(out, max_files: int = 8) -> str:
    body = re.search(r"^fold_out\(\) \{.*?^\}", SCRIPT.read_text(), re.S | re.M).group(0)
    proc = subprocess.run(
        ["bash", "-c", f"{body}\nfold_out"],
        env={"OUT": str(out), "OUT_MAX_FILES": str(max_files), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def names(out) -> set[str]:
    return {p.name for p in out.iterdir() if p.is_file()}


def test_a_call_within_the_limit_is_left_as_it_is(tmp_path):
    for n in ("install.log", "tests.log", "sweep.log", "sweep.tgz", "clocks.csv.gz"):
        (tmp_path / n).write_text(n)
    assert fold(tmp_path) == ""
    assert names(tmp_path) == {"install.log", "tests.log", "sweep.log", "sweep.tgz", "clocks.csv.gz"}


def test_too_many_files_fold_the_logs_first_and_keep_every_byte(tmp_path):
    logs = [f"step{i}.log" for i in range(6)]
    kept = ["sweep.tgz", "probe.tgz", "batching.json", "clocks.csv.gz"]
    for n in logs + kept:
        (tmp_path / n).write_text(f"content of {n}")
    said = fold(tmp_path)
    assert "folded into logs.tgz" in said
    assert names(tmp_path) == {*kept, "logs.tgz"}  # 5 files: the archives and data untouched
    listed = subprocess.run(["tar", "-tzf", str(tmp_path / "logs.tgz")], capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == sorted(logs)


def test_still_too_many_folds_everything_but_the_archives(tmp_path):
    archives = [f"a{i}.tgz" for i in range(6)]
    for n in [*archives, "x.json", "y.json", "z.log"]:
        (tmp_path / n).write_text(n)
    fold(tmp_path, max_files=7)
    assert names(tmp_path) == {*archives, "rest.tgz"}


def pick(tmp_path, spec: str | None, gpu: str | None) -> subprocess.CompletedProcess:
    """session.sh's own ``pick_experiment`` with a fake nvidia-smi on PATH (the process boundary: the card
    the device tool lent), or none at all."""
    body = re.search(r"^pick_experiment\(\) \{.*?^\}", SCRIPT.read_text(), re.S | re.M).group(0)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho '{gpu}'\n")
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **({"SESSION_EXPERIMENT": spec} if spec is not None else {})}
    return subprocess.run(["bash", "-c", f"{body}\npick_experiment"], env=env, capture_output=True, text=True)


def test_the_sweep_picks_its_experiment_by_the_card_the_call_got(tmp_path):
    both = "H200=embedded_h200x1_steps_nccl,H100=embedded_h100x1_steps_nccl"
    assert pick(tmp_path, both, "NVIDIA H100 80GB HBM3").stdout.strip() == "embedded_h100x1_steps_nccl"
    assert pick(tmp_path, both, "NVIDIA H200").stdout.strip() == "embedded_h200x1_steps_nccl"
    assert pick(tmp_path, "embedded_h100x1_steps_nccl", None).stdout.strip() == "embedded_h100x1_steps_nccl"
    assert pick(tmp_path, None, None).stdout.strip() == "embedded_h200x2_steps_nccl"
    none = pick(tmp_path, both, "NVIDIA A100-SXM4-80GB")
    assert none.returncode == 1 and none.stdout == ""
    assert f"SESSION_EXPERIMENT={both}: no experiment for this GPU ('NVIDIA A100-SXM4-80GB')" in none.stderr
