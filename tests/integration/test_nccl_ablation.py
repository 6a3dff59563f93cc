"""The per-variable NCCL ablation on gloo with 2 real rank processes (what CI can run): every arm's
variables reach its probe's ranks, equal arms are measured once, the table has one row per arm."""

import subprocess
import sys

import pytest

from spec_decode.probe.ablation import ablate, arms

from ..conftest import ROOT

pytestmark = pytest.mark.integration
PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}


def test_arms_are_default_all_leave_one_out_and_one_at_a_time():
    labels = [a for a, _ in arms(PROFILE)]
    assert labels == [
        "default",
        "all",
        "-NCCL_PROTO",
        "-NCCL_ALGO",
        "-NCCL_P2P_LEVEL",
        "+NCCL_PROTO",
        "+NCCL_ALGO",
        "+NCCL_P2P_LEVEL",
    ]
    assert dict(arms(PROFILE))["-NCCL_ALGO"] == {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}


def test_ablation_on_gloo_puts_each_arms_variables_in_its_ranks():
    two = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    res = ablate(2, "gloo", [4096], two, iters=5, warmup=1, rounds=1, debug=False)
    assert res["probes"] == 4  # default, all, and -PROTO == +ALGO, -ALGO == +PROTO
    by_arm = {r["arm"]: r for r in res["arms"]}
    assert {k: v["rank_env"] for k, v in by_arm.items()} == {
        "default": {},
        "all": two,
        "-NCCL_PROTO": {"NCCL_ALGO": "Ring"},
        "-NCCL_ALGO": {"NCCL_PROTO": "LL"},
        "+NCCL_PROTO": {"NCCL_PROTO": "LL"},
        "+NCCL_ALGO": {"NCCL_ALGO": "Ring"},
    }
    assert by_arm["default"]["vs_default"]["4096"] == 1.0 and all(r["correct"] for r in res["arms"])


def test_ablation_cli_prints_the_table_with_sglangs_launcher_writes():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.probe.ablation",
            "--backend",
            "gloo",
            "--env",
            "NCCL_PROTO=LL",
            "--sizes",
            "4096",
            "--iters",
            "3",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--sglang-launcher",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| default", "| all"]
    assert "probes=2" in p.stdout
