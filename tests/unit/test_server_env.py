"""What the server's environment inherits: the NCCL profile alone decides NCCL tuning; host-safety
variables (NVLink multicast off) survive."""

import pytest

from spec_decode.runner.server import server_env

pytestmark = pytest.mark.unit


def test_inherited_nccl_tuning_dropped_but_nvls_off_kept(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # a stray shell tuning
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the host's rule
    env = server_env({"NCCL_PROTO": "LL"})
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0"}
