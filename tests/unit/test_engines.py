"""The engine object (spec_decode/engines/engine.py): what each engine answers for the code that used to
branch on its name, from real composed configs."""

import pytest

from spec_decode.analysis import lossless
from spec_decode.engines.engine import EmbeddedEngine, SglangEngine, engine_of, named

from ..conftest import compose_experiment

pytestmark = pytest.mark.unit

DIVERGED = [lossless.Comparison("0", [1, 2, 3], [1, 2, 4], 3)]


def test_one_lookup_from_the_config_and_from_a_records_name():
    assert isinstance(engine_of(compose_experiment()), EmbeddedEngine)
    assert isinstance(engine_of(compose_experiment("engine=sglang", "hardware=h200x1")), SglangEngine)
    assert named("sglang") is engine_of(compose_experiment("engine=sglang", "hardware=h200x1"))
    with pytest.raises(ValueError, match="engine 'vllm': use one of embedded, sglang"):
        named("vllm")


def test_a_divergence_fails_on_the_exact_engine_and_warns_on_sglang():
    verdicts = {
        n: lossless.guard(DIVERGED, named(n).exact_outputs, 0.0, False, True).verdict for n in ("embedded", "sglang")
    }
    assert verdicts == {"embedded": "fail", "sglang": "warn"}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), None),  # the embedded engine on CPU: host stamps time the work
        (("hardware=h200x1",), EmbeddedEngine.HOST_STAMPS_NA),  # on CUDA a cycle returns once queued
        # ... with overlap off too: the loop reads the result after the cycle returns (the H200's false alarm)
        (("hardware=h200x1", "engine.disable_overlap_schedule=true"), EmbeddedEngine.HOST_STAMPS_NA),
        (("engine=sglang", "hardware=h200x1"), SglangEngine.HOST_STAMPS_NA),  # SGLang's overlap scheduler
        (("engine=sglang", "hardware=h200x1", "engine.extra_args=[--disable-overlap-schedule]"), None),
    ],
)
def test_host_stamps_na_says_when_the_profiles_host_stamps_do_not_time_the_gpu(overrides, expected):
    cfg = compose_experiment(*overrides)
    assert engine_of(cfg).host_stamps_na(cfg) == expected


@pytest.mark.parametrize(
    ("overrides", "inert"),
    [
        ((), "on a CPU"),  # no NCCL on a CPU, whatever the tp size
        (("hardware=cpu", "hardware.tp_size=2"), "on a CPU"),
        (("hardware=h200x1",), "at tp 1"),  # one rank: no process group at all
        (("hardware=h100x1",), "at tp 1"),
        (("hardware=h200x2",), None),  # the ranks' all-reduces run on NCCL
        (("engine=sglang", "hardware=h200x1"), None),  # SGLang sets up torch.distributed even at tp 1
    ],
)
def test_nccl_inert_says_where_no_nccl_runs(overrides, inert):
    cfg = compose_experiment(*overrides)
    why = engine_of(cfg).nccl_inert(cfg.hardware)
    assert (why is None) if inert is None else why.startswith(inert), why


def test_what_preflight_and_the_doctor_ask():
    emb, sgl = named("embedded"), named("sglang")
    assert (emb.external, emb.byte_tokens, emb.resolves_hub_ids, emb.refuses_eager_overflow) == (
        False,
        True,
        False,
        False,
    )
    assert (sgl.external, sgl.byte_tokens, sgl.resolves_hub_ids, sgl.refuses_eager_overflow) == (
        True,
        False,
        True,
        True,
    )
    assert emb.default_max_running(True) is None
    assert (sgl.default_max_running(True), sgl.default_max_running(False)) == (48, None)
    cfg = compose_experiment("engine=sglang", "hardware=h200x1", "engine.pcie_ipc_allreduce=true")
    assert sgl.server_env(cfg) == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert emb.server_env(compose_experiment()) == {}
