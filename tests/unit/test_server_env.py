"""What the server's environment inherits: the NCCL profile alone decides NCCL tuning; host-safety
variables (NVLink multicast off) survive."""

import pytest

from spec_decode.core.config import ConfigError
from spec_decode.engines import rank_nccl_env, server_extra_env
from spec_decode.engines.server_process import server_env

from ..conftest import compose_experiment

pytestmark = pytest.mark.unit


def test_inherited_nccl_tuning_dropped_but_nvls_off_kept(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # a stray shell tuning
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the host's rule
    env = server_env({"NCCL_PROTO": "LL"})
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0"}


def test_a_containers_nccl_version_label_is_no_dropped_tuning(monkeypatch):
    """NVIDIA's images export NCCL_VERSION (the lent H200: 2.28.3-1), which NCCL never reads: it is not
    named as a dropped NCCL variable (the warning fired on every job of the 2026-12-04 GPU session), and
    it passes through; a real stray tuning beside it is still named."""
    from spec_decode.runner.preflight import inherited_nccl

    cfg = compose_experiment("nccl=tuned")
    monkeypatch.setenv("NCCL_VERSION", "2.28.3-1")
    assert inherited_nccl(cfg, {"NCCL_VERSION": "2.28.3-1", "PATH": "/bin"}) is None
    assert server_env({})["NCCL_VERSION"] == "2.28.3-1"
    warning = inherited_nccl(cfg, {"NCCL_VERSION": "2.28.3-1", "NCCL_ALGO": "Tree"})
    assert warning is not None and "NCCL_ALGO=Tree" in warning and "NCCL_VERSION" not in warning


def test_which_allreduce_runs_is_the_configs_never_an_inherited_switch(monkeypatch):
    """SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (SGLang's PCIe-IPC all-reduce, chosen before NCCL for decode):
    engine.pcie_ipc_allreduce decides it, passed explicitly; an inherited copy never reaches a server."""
    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1")  # a stray shell switch
    for choice, value in (("false", "0"), ("true", "1")):
        cfg = compose_experiment("engine=sglang", "hardware=h200x2", f"engine.pcie_ipc_allreduce={choice}")
        assert server_env(server_extra_env(cfg, None))["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == value
    embedded = compose_experiment()
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in server_env(server_extra_env(embedded, None))
    with pytest.raises(ConfigError, match="engine.env.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: set engine.pcie_ipc_allreduce"):
        compose_experiment("engine=sglang", "hardware=h200x2", "+engine.env.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")


def test_the_probe_gets_the_nccl_variables_sglangs_ranks_run_with(monkeypatch):
    """The NCCL probe of an engine=sglang job runs with the profile plus what SGLang's launcher writes
    before spawning its ranks (set where unset; --enable-deterministic-inference overwrites)."""
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # a stray shell tuning: dropped, as from the server
    cfg = compose_experiment("engine=sglang", "hardware=h200x2", "nccl=tuned")
    assert rank_nccl_env(cfg) == {
        **cfg.nccl.env,
        "NCCL_CUMEM_ENABLE": "0",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_GRAPH_REGISTER": "0",
    }
    det = compose_experiment(
        "engine=sglang", "hardware=h200x2", "nccl=tuned", "engine.extra_args=[--enable-deterministic-inference]"
    )
    assert {k: rank_nccl_env(det)[k] for k in ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")} == {
        "NCCL_ALGO": "allreduce:tree",
        "NCCL_MIN_NCHANNELS": "8",
        "NCCL_MAX_NCHANNELS": "8",
    }
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the host's kept rule, and an explicit profile value win
    one = compose_experiment("engine=sglang", "hardware=h200x1", "+nccl.env.NCCL_CUMEM_ENABLE=1")
    assert rank_nccl_env(one) == {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "0"}  # tp 1: no GRAPH_REGISTER
    embedded = compose_experiment("nccl=tuned")
    assert rank_nccl_env(embedded) == {**embedded.nccl.env, "NCCL_NVLS_ENABLE": "0"}  # no launcher writes
