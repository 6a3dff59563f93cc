"""The all-reduce probe: the gloo path with 2 real processes (what CI can run), in a job, its command
line, the NCCL_DEBUG parser on captured multi-rank logs, and (marker gpu) the NCCL path on 2 GPUs."""

import json
import os
import subprocess
import sys

import pytest

from spec_decode.analysis.sections import nccl_metrics as metrics_of
from spec_decode.probe.nccl import DEFAULT_SIZES, combine, probe, profile_env
from spec_decode.probe.nccl_debug import ALGO_NAMES, PROTO_NAMES, parse_nccl_debug
from spec_decode.record.payloads import nccl_probe_from

from ..conftest import ROOT, run_py, small

pytestmark = pytest.mark.integration
LOGS = ROOT / "tests" / "data" / "logs"


def test_gloo_two_processes_give_plausible_latencies_and_the_right_sum():
    res = probe(2, "gloo", [4096, 65536], iters=30, warmup=5, rounds=4, env={"NCCL_PROTO": "LL"})
    assert res["correct"] is True
    for v in res["sizes"].values():
        assert v["correct"] and 0 < v["median_us"] < 1e6 and v["p90_us"] >= v["median_us"]
        assert v["rounds"] == 4 and "device_median_us" not in v  # gloo: the host is the device
    assert set(metrics_of(nccl_probe_from(res))) == {"nccl_allreduce_us_4096", "nccl_allreduce_us_65536"}
    assert res["env"] == {"NCCL_PROTO": "LL"}  # set in the probe's processes only
    assert res["machine"]["nccl_env"]["NCCL_PROTO"] == "LL"  # ... and read back from a rank


def test_probe_env_does_not_leak_into_the_caller():
    probe(2, "gloo", [4096], iters=5, warmup=1, rounds=1, env={"NCCL_ALGO": "Ring"})
    assert "NCCL_ALGO" not in os.environ


def test_ranks_combine_per_round_slowest_and_drop_rounds_where_the_host_was_late():
    r0 = {
        "sizes": {
            "4096": {
                "eager_us": [40.0, 41.0, 90.0],
                "device_us": [7.0, 7.2, 30.0],
                "host_ahead": [True, True, True],
                "correct": True,
            }
        }
    }
    r1 = {
        "sizes": {
            "4096": {
                "eager_us": [42.0, 40.0, 39.0],
                "device_us": [7.4, 7.1, 7.3],
                "host_ahead": [True, True, False],
                "correct": True,
            }
        }
    }
    got = combine([r0, r1], [4096], rounds=3, iters=200, backend="nccl")["4096"]
    assert got["median_us"] == 42.0  # per round max(40, 42), max(41, 40), max(90, 39) -> 42, 41, 90
    assert got["device_rounds"] == 2  # round 3: rank 1's host was still queueing when its spin ended
    assert got["device_median_us"] == pytest.approx(7.3) and got["device_p90_us"] == pytest.approx(7.38)
    late = {"sizes": {"4096": {**r1["sizes"]["4096"], "host_ahead": [False] * 3}}}
    none = combine([r0, late], [4096], rounds=3, iters=200, backend="nccl")["4096"]
    assert none["device_median_us"] is None and "no device figure" in none["device_note"]


def test_device_figures_become_metrics_next_to_the_eager_ones():
    size = {"iters": 200, "rounds": 3, "correct": True, "p90_us": 70.0}
    res = {
        "backend": "nccl",
        "world_size": 2,
        "sizes": {
            "4096": {**size, "median_us": 40.0, "device_median_us": 7.6},
            "1048576": {**size, "median_us": 60.0, "device_median_us": None},
        },
    }
    assert metrics_of(nccl_probe_from(res)) == {
        "nccl_allreduce_us_4096": 40.0,
        "nccl_allreduce_us_1048576": 60.0,
        "nccl_allreduce_device_us_4096": 7.6,
    }


def test_job_with_probe_records_latencies_and_provenance(tmp_path):
    run_py(
        [
            "preflight.nccl_probe=true",
            "preflight.nccl_probe_iters=20",
            "nccl=tuned",
            "tracking=off",
            "benchmark.baseline_arm=false",
            *small("benchmark.profile=false"),  # the probe runs in preflight, before the server
            f"hydra.run.dir={tmp_path}",
        ]
    )
    rec = json.loads((tmp_path / "results.json").read_text())
    assert rec["nccl_probe"]["correct"] and rec["nccl_probe"]["env"]["NCCL_PROTO"] == "LL"
    assert "nccl_allreduce_us_4096" in rec["metrics"] and "nccl_allreduce_us_768" in rec["metrics"]  # 192 x fp32
    assert rec["provenance"]["nccl"]["backend"] == "gloo"


def test_cli_names_the_flag_for_a_profile_that_does_not_exist():
    proc = subprocess.run(
        [sys.executable, "-m", "spec_decode.probe.nccl", "--nccl", "tunned"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--nccl tunned" in proc.stderr and "no_p2p" in proc.stderr and "tuned" in proc.stderr


def test_cli_gloo_table_with_a_profile_and_the_models_decode_size(tmp_path):
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.probe.nccl",
            "--backend",
            "gloo",
            "--nccl",
            "no_p2p",
            "--sizes",
            "4096",
            "--model-path",
            "models/tiny/target",
            "--iters",
            "10",
            "--rounds",
            "2",
            "--warmup",
            "2",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["env"] == {"NCCL_P2P_DISABLE": "1"} and res["profile"] == "no_p2p"
    assert sorted(res["sizes"], key=int) == ["768", "4096"]  # 192 hidden x fp32 (config.json's dtype)
    assert "| 768 |" in proc.stdout and "| 4096 |" in proc.stdout


# --- NCCL_DEBUG=INFO parsing ------------------------------------------------------------------


def test_parser_reads_the_formats_nccl_prints():
    text = "\n".join(
        [
            "h:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
            "h:1:1 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.",
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
            "h:1:1 [0] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f recvbuff 0x7f count 2048 datatype 9 op 0 "
            "root 0 comm 0x55 [nranks=2] stream 0x56",
            # >= 2.19: names in upper case (ncclAlgoToString), rank 0 only
            "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
            "h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo TREE proto SIMPLE channel{Lo..Hi}={0..15}",
            "h:1:1 [0] NCCL INFO AllGather: 8192 Bytes -> Algo NVLS proto LL128 channel{Lo..Hi}={0..3}",
            # <= 2.18: numbers
            "h:1:1 [0] NCCL INFO 65536 Bytes -> Algo 1 proto 1 time 12.500000",
        ]
    )
    got = parse_nccl_debug(text)
    assert got["nccl_version"] == "2.28.9+cuda13.0"
    assert got["algorithms"] == ["Ring", "Tree"] and got["protocols"] == ["LL", "LL128", "Simple"]
    assert got["choices"]["4096"] == {"algorithm": "Ring", "protocol": "LL", "channels": 2}
    assert got["choices"]["1048576"] == {"algorithm": "Tree", "protocol": "Simple", "channels": 16}
    assert got["choices"]["65536"] == {"algorithm": "Ring", "protocol": "LL128", "channels": None}
    assert "8192" not in got["choices"]  # an all-gather is not an all-reduce
    assert got["transports"] == ["SHM/direct/direct"]
    assert got["nccl_env_read"] == {"NCCL_P2P_DISABLE": "1"}


GOLDEN = {p: LOGS / f"nccl_debug_{p}.log" for p in ("default", "tuned", "no_p2p")}


@pytest.mark.parametrize("profile", sorted(GOLDEN))
def test_parser_on_captured_two_rank_logs(profile):
    """Whatever capture lies at the path (benchmarks/gpu/session.sh probe writes these names): the
    session probes DEFAULT_SIZES, so each has NCCL's choice; a forced profile shows what it forces."""
    text = GOLDEN[profile].read_text()
    got = parse_nccl_debug(text)
    assert got["nccl_version"] and got["nccl_version"][0].isdigit()
    assert {str(s) for s in DEFAULT_SIZES} <= set(got["choices"]), sorted(got["choices"], key=int)
    assert got["algorithms"] and set(got["algorithms"]) <= set(ALGO_NAMES.values())
    assert got["protocols"] and set(got["protocols"]) <= set(PROTO_NAMES.values())
    assert got["transports"], "no 'Channel .. via ..' line: was NCCL_DEBUG_SUBSYS missing INIT?"
    env = profile_env(profile, ROOT / "conf")
    if "NCCL_ALGO" in env:
        assert got["algorithms"] == [env["NCCL_ALGO"]] and got["protocols"] == [env["NCCL_PROTO"]]
    if env.get("NCCL_P2P_DISABLE") == "1":
        assert not [t for t in got["transports"] if t.startswith("P2P")], got["transports"]
    if profile == "default":  # the lent machine's GPUs reach each other directly (NVLink)
        assert any(t.startswith("P2P") for t in got["transports"]), got["transports"]


# --- On 2 GPUs (never in CI) ------------------------------------------------------------------


def _two_gpus() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 CUDA devices")
def test_nccl_device_latency_grows_with_size_and_is_not_the_host(tmp_path):
    """The old figure (events around each call) was flat at ~100 us from 4 KiB to 1 MiB: the host.
    On the device, a small NVLink all-reduce takes ~10 us, and 1 MiB takes longer than 4 KiB."""
    import torch

    log = tmp_path / "nccl.log"
    res = probe(2, "nccl", [4096, 1048576], iters=100, warmup=10, rounds=5, debug_log=log, timeout_s=180)
    small_, large = res["sizes"]["4096"], res["sizes"]["1048576"]
    assert res["correct"]
    assert small_["device_rounds"] >= 3 and large["device_rounds"] >= 3  # host ahead of the GPU
    assert small_["device_median_us"] < 30, small_
    assert large["device_median_us"] > 1.2 * small_["device_median_us"], (small_, large)
    assert small_["median_us"] > 0.9 * small_["device_median_us"]  # eager cannot beat the device
    assert res["nccl_version"].startswith(".".join(map(str, torch.cuda.nccl.version())))
    assert {"4096", "1048576"} <= set(res["choices"]) and res["transports"]
    assert "NCCL INFO" in log.read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 CUDA devices")
def test_nccl_profiles_take_effect_tuned_forces_ring_ll_no_p2p_loses_p2p(tmp_path):
    tuned = probe(
        2, "nccl", [4096], iters=50, warmup=5, rounds=2, env=profile_env("tuned", ROOT / "conf"), timeout_s=180
    )
    assert tuned["algorithms"] == ["Ring"] and tuned["protocols"] == ["LL"]
    lost = probe(
        2, "nccl", [4096], iters=50, warmup=5, rounds=2, env=profile_env("no_p2p", ROOT / "conf"), timeout_s=180
    )
    assert lost["transports"] and not [t for t in lost["transports"] if t.startswith("P2P")]
    assert lost["machine"]["nccl_env"]["NCCL_P2P_DISABLE"] == "1"
