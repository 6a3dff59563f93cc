"""Synthetic real-shape targets (issue 31) without a server: the generator (seeded, bf16, cached by its
spec), bf16 decoding on CPU, the config keys (token mode, accept-length tables), what reaches the
server's env, preflight's refusals and the performance-only label."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from spec_decode.core.config import ConfigError
from spec_decode.engines import server_extra_env
from spec_decode.engines.embedded import synthetic
from spec_decode.engines.embedded.decoding import FILL_TOKEN, Decoder, ForcedAcceptance
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.record import results
from spec_decode.runner import preflight
from spec_decode.runner.baselines import baseline_config
from spec_decode.runner.context import JobContext, new_record

from ..conftest import compose_experiment

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PAIR = ["model=synthetic_tiny", "drafter=synthetic_tiny_eagle3"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    synthetic.ensure("synthetic_tiny", "synthetic_tiny_eagle3", "cpu", root=root)
    return root


def test_the_generator_is_seeded_bf16_of_the_conf_shape_and_kept_when_its_spec_matches(tiny, tmp_path):
    target, drafter = tiny / "models/synthetic/tiny", tiny / "models/synthetic/tiny_eagle3"
    cfg = json.loads((target / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["torch_dtype"]) == (
        64,
        4,
        512,
        "bfloat16",
    )
    dcfg = json.loads((drafter / "config.json").read_text())
    assert dcfg["draft_vocab_size"] == 256 and dcfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    again = tmp_path / "again"
    synthetic.ensure("synthetic_tiny", "synthetic_tiny_eagle3", "cpu", root=again)
    for rel in ("models/synthetic/tiny/model.safetensors", "models/synthetic/tiny_eagle3/model.safetensors"):
        assert sha(tiny / rel) == sha(again / rel)  # the same seed: the same bytes
    lines = synthetic.ensure("synthetic_tiny", "synthetic_tiny_eagle3", "cpu", root=again)
    assert all("kept" in line for line in lines)
    record = json.loads((again / "models/synthetic/tiny/synthetic.json").read_text())
    record["spec"]["seed"] = 5  # what a conf with another seed would ask for
    (again / "models/synthetic/tiny/synthetic.json").write_text(json.dumps(record))
    assert "generated on cpu" in synthetic.ensure("synthetic_tiny", None, "cpu", root=again)[0]
    other = synthetic.random_state(load_target(target).lm_head, 1, torch.bfloat16, torch.device("cpu"))
    assert not torch.equal(
        other["weight"],
        synthetic.random_state(load_target(target).lm_head, 2, torch.bfloat16, torch.device("cpu"))["weight"],
    )


def test_bf16_decoding_on_cpu_is_deterministic_and_forced_like_sglang(tiny):
    torch.set_num_threads(1)
    target = load_target(tiny / "models/synthetic/tiny")
    drafter = load_drafter(tiny / "models/synthetic/tiny_eagle3", target)
    assert target.lm_head.weight.dtype == drafter.fc.weight.dtype == target.cos.dtype == torch.bfloat16
    assert target.new_cache().k.dtype == torch.bfloat16
    ids = list(b"def f(x):\n")
    runs = []
    for _ in range(2):
        forced = ForcedAcceptance(2.5, 3, token_mode="real-draft-token", seed=0)
        runs.append(Decoder(target, drafter, 3, None, forced).generate(ids, 60))
    assert runs[0].output_ids == runs[1].output_ids
    assert abs(len(runs[0].output_ids) / runs[0].verify_ct - 2.5) < 0.3
    assert max(runs[0].output_ids) > 255  # random weights of a 512-token vocabulary: not bytes
    fixed = Decoder(target, drafter, 3, None, ForcedAcceptance(2.0, 3, seed=0)).generate(ids, 20)
    assert set(fixed.output_ids[1:]) == {FILL_TOKEN}  # after prefill's token, every committed one is 100


def test_token_mode_and_table_are_config_keys_that_reach_the_server_env():
    cfg = compose_experiment(
        "spec.steps=3", "spec.simulate_accept_len=2.5", "spec.simulate_token_mode=real-draft-token"
    )
    env = server_extra_env(cfg, None)
    assert env["SGLANG_SIMULATE_ACC_TOKEN_MODE"] == "real-draft-token" and env["SGLANG_SIMULATE_ACC_LEN"] == "2.5"
    assert "SGLANG_SIMULATE_ACC_TOKEN_MODE" not in server_extra_env(baseline_config(cfg), None)
    tabled = compose_experiment("spec.steps=3", "spec.simulate_accept_table=kimi_k25_eagle3")
    assert tabled.spec.simulate_accept_len == 3.285  # the published steps-3 entry
    assert server_extra_env(tabled, None)["SGLANG_SIMULATE_ACC_LEN"] == "3.285"


@pytest.mark.parametrize(
    "overrides,named",
    [
        (
            ["spec.simulate_accept_len=2", "spec.simulate_token_mode=zero"],
            "spec.simulate_token_mode='zero': use one of",
        ),
        (["spec.simulate_token_mode=real-draft-token"], "spec.simulate_token_mode=real-draft-token without"),
        (["+engine.env.SGLANG_SIMULATE_ACC_TOKEN_MODE=fixed"], "engine.env.SGLANG_SIMULATE_ACC_TOKEN_MODE: set spec"),
        (["spec.steps=4", "spec.simulate_accept_table=kimi_k25_eagle3"], "no accept length for spec.steps=4"),
        (["spec.simulate_accept_table=nope"], "spec.simulate_accept_table=nope: no nope.yaml"),
        (["spec.simulate_accept_table=kimi_k25_eagle3", "spec.simulate_accept_len=2"], "set one of them"),
        ([*PAIR, "model.synthetic.dtype=fp8"], "synthetic.dtype='fp8'"),
    ],
)
def test_bad_keys_fail_at_compose_time_naming_them(overrides, named):
    with pytest.raises(ConfigError) as exc:
        compose_experiment(*overrides)
    assert named in str(exc.value)


def test_preflight_refuses_a_synthetic_pair_without_forcing_and_names_the_generator(tiny, tmp_path):
    unforced = preflight.check(compose_experiment(*PAIR, "spec.steps=3"), tiny).errors
    assert any("random (synthetic) weights" in e and "spec.simulate_accept_len" in e for e in unforced)
    forced = compose_experiment(*PAIR, "spec.steps=3", "spec.simulate_accept_len=2")
    assert not [e for e in preflight.check(forced, tiny).errors if "synthetic" in e]
    missing = preflight.check(forced, tmp_path).errors  # nothing generated under this root
    command = "python -m spec_decode build synthetic --model synthetic_tiny --drafter synthetic_tiny_eagle3"
    assert sum(command in e for e in missing) == 2, missing
    placeholder = compose_experiment(*PAIR, "spec.steps=1", "spec.simulate_accept_table=kimi_k25_eagle3")
    assert any("not a published number" in w for w in preflight.check(placeholder, tiny).warnings)


def test_every_record_on_a_synthetic_target_is_performance_only(tmp_path):
    ctx = JobContext(out_dir=tmp_path, run_name="x", root=ROOT)
    cfg = compose_experiment(*PAIR, "spec.simulate_accept_len=2")
    spec = new_record(cfg, ctx, "spec", {}, [])
    base = new_record(baseline_config(cfg), ctx, "baseline", {}, [])
    assert results.performance_only(spec) and results.performance_only(base)
    assert not results.performance_only(new_record(baseline_config(compose_experiment()), ctx, "baseline", {}, []))
