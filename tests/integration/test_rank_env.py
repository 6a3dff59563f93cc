"""The environment of every rank: read from the rank processes (the launcher's children), not from the
launcher's /proc environ. A fake launcher at the process boundary (tests/rank_launcher.py) writes NCCL
variables in Python before it spawns the real embedded engine's ranks, as SGLang's launcher does."""

import json
import os

import pytest

from spec_decode.engines.sglang import DETERMINISTIC_WRITES, ENV_WRITES, GRAPH_REGISTER

from ..conftest import run_py, small

pytestmark = pytest.mark.integration
LAUNCHER = [
    "engine.launcher=[python,tests/rank_launcher.py]",
    "hardware.tp_size=2",
    "drafter=none",
    "nccl=tuned",
    "tracking=off",
]


def job(tmp_path, *extra) -> dict:
    run_py([*LAUNCHER, *small(), *extra, f"hydra.run.dir={tmp_path / 'job'}"])
    return json.loads((tmp_path / "job" / "results.json").read_text())


def launcher_writes() -> dict[str, str]:
    """What the fake launcher writes for the ranks (NCCL_NVLS_ENABLE may be inherited: then kept)."""
    out = {k: v for k, (v, _) in ENV_WRITES.items() if k not in os.environ}
    return {**out, GRAPH_REGISTER[0]: GRAPH_REGISTER[1]}


def test_record_holds_the_ranks_environment_and_raises_no_false_warning(tmp_path):
    rec = job(tmp_path)
    launcher_pid = str(rec["launches"][0]["pid"])
    procs = rec["server_env_processes"]
    assert len(procs) >= 3 and launcher_pid in procs  # the launcher and its 2 ranks
    for k in launcher_writes():
        assert k not in procs[launcher_pid]  # /proc of the launcher never shows its own writes
    nccl_writes = {k: v for k, v in rec["server_env_set_by_engine"].items() if k.startswith("NCCL_")}
    assert nccl_writes == launcher_writes()
    assert {k: rec["server_env"][k] for k in launcher_writes()} == launcher_writes()
    assert rec["server_env"]["NCCL_PROTO"] == "LL" and rec["server_env"]["NCCL_P2P_LEVEL"] == "SYS"
    # no warning about the ranks' NCCL environment (the CPU-profile note on nccl=tuned is preflight's, true here)
    assert not [w for w in rec["warnings"] if "NCCL" in w and "on a CPU profile" not in w], rec["warnings"]


def test_a_launcher_overwriting_the_profile_is_recorded_and_named(tmp_path):
    rec = job(tmp_path, "+engine.env.LAUNCHER_DETERMINISTIC=1")
    for k, v in DETERMINISTIC_WRITES.items():
        assert rec["server_env"][k] == v and rec["server_env_set_by_engine"][k] == v
    warned = [w for w in rec["warnings"] if "NCCL" in w]
    assert any(
        "nccl=tuned sets NCCL_ALGO=Ring but the server's ranks ran with NCCL_ALGO=allreduce:tree" in w for w in warned
    ), warned
    assert any("NCCL_MAX_NCHANNELS=16" in w and "NCCL_MAX_NCHANNELS=8" in w for w in warned), warned
    assert not [w for w in warned if "do not share" in w], warned
