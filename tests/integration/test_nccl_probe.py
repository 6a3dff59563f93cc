"""The all-reduce probe: the gloo path with 2 real processes (what CI can run), and in a job."""

import json

import pytest

from spec_decode.nccl_probe import metrics_of, parse_nccl_debug, probe

from ..conftest import run_py, small

pytestmark = pytest.mark.integration


def test_gloo_two_processes_give_plausible_latencies_and_the_right_sum():
    res = probe(2, "gloo", [4096, 65536], iters=30, warmup=5, env={"NCCL_PROTO": "LL"})
    assert res["correct"] is True
    for v in res["sizes"].values():
        assert v["correct"] and 0 < v["median_us"] < 1e6 and v["p90_us"] >= v["median_us"]
    assert set(metrics_of(res)) == {"nccl_allreduce_us_4096", "nccl_allreduce_us_65536"}
    assert res["env"] == {"NCCL_PROTO": "LL"}  # set in the probe's processes only


def test_probe_env_does_not_leak_into_the_caller():
    import os

    probe(2, "gloo", [4096], iters=5, warmup=1, env={"NCCL_ALGO": "Ring"})
    assert "NCCL_ALGO" not in os.environ


def test_job_with_probe_records_latencies_and_provenance(tmp_path):
    run_py(["preflight.nccl_probe=true", "preflight.nccl_probe_iters=20", "nccl=tuned", "tracking=off",
            "benchmark.baseline_arm=false", *small(), f"hydra.run.dir={tmp_path}"])
    rec = json.loads((tmp_path / "results.json").read_text())
    assert rec["nccl_probe"]["correct"] and rec["nccl_probe"]["env"]["NCCL_PROTO"] == "LL"
    assert "nccl_allreduce_us_4096" in rec["metrics"] and "nccl_allreduce_us_768" in rec["metrics"]  # 192 x fp32
    assert rec["provenance"]["nccl"]["backend"] == "gloo"


def test_parse_nccl_debug_lines():
    text = "\n".join([
        "h:10:10 [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        "h:10:20 [0] NCCL INFO 4096 Bytes -> Algo 1 proto 0 time 10.5",
        "h:10:20 [0] NCCL INFO 1048576 Bytes -> Algo 1 proto 2 time 80.1",
        "h:10:20 [0] NCCL INFO AllReduce: 16384 bytes using Tree/LL",
    ])
    got = parse_nccl_debug(text)
    assert got["nccl_version"] == "2.27.3+cuda12.9"
    assert got["algorithms"] == ["Ring", "Tree"] and got["protocols"] == ["LL", "Simple"]
