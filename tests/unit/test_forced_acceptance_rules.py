"""Forced acceptance without a server: the draws (SGLang 0.5.23's sample_simulated_acc_len), the config
rules, what reaches the server's environment, and the performance-only label of a record."""

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from spec_decode.core.config import ConfigError
from spec_decode.engines import server_extra_env
from spec_decode.engines.embedded.decoding import FILL_TOKEN, ForcedAcceptance
from spec_decode.engines.server_process import server_env
from spec_decode.record import results
from spec_decode.runner.baselines import baseline_config
from spec_decode.runner.context import JobContext, new_record
from spec_decode.runner.summary import job_summary
from spec_decode.views.mlflow_run import tags_of

from ..conftest import compose_experiment

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


experiment = compose_experiment


@pytest.mark.parametrize("x,values", [(2.3, {2, 3}), (2.0, {2}), (1.0, {1}), (4.0, {4}), (3.75, {3, 4})])
def test_match_expected_draws_floor_or_ceil_with_mean_x(x, values):
    forced = ForcedAcceptance(x, steps=3, seed=0)
    draws = [forced.draw() for _ in range(4000)]
    assert set(draws) == values
    assert abs(sum(draws) / len(draws) - x) < 0.03  # sd of the mean <= 0.5 / sqrt(4000) = 0.008


def test_draws_are_clamped_to_one_verify_and_seeded():
    assert {ForcedAcceptance(9.0, steps=2).draw() for _ in range(50)} == {3}  # SGLang clamps to steps+1
    multi = ForcedAcceptance(2.0, steps=3, method="multinomial", seed=1)
    draws = [multi.draw() for _ in range(4000)]
    # round(clamp(N(2, 1), 1, 4)): P = 0.31, 0.38, 0.24, 0.07 for 1..4, mean 2.07
    assert set(draws) == {1, 2, 3, 4} and abs(sum(draws) / len(draws) - 2.07) < 0.06
    a, b = (ForcedAcceptance(2.5, steps=3, seed=5) for _ in range(2))
    assert [a.draw() for _ in range(200)] == [b.draw() for _ in range(200)]


def test_token_modes_rewrite_the_predictions_like_sglang():
    draft, pred = torch.tensor([11, 12, 13]), torch.tensor([21, 22, 23, 24])
    fixed = ForcedAcceptance(2.0, steps=3).apply(draft, pred, 3)
    assert fixed.tolist() == [FILL_TOKEN] * 4 and pred.tolist() == [21, 22, 23, 24]  # a new tensor
    real = ForcedAcceptance(2.0, steps=3, token_mode="real-draft-token").apply(draft, pred, 3)
    assert real.tolist()[:3] == [11, 12, 23]  # drafts 1..n-1, then the target's token after them


def test_env_parsing_follows_sglang():
    assert ForcedAcceptance.from_env(3, 0, {}) is None
    assert ForcedAcceptance.from_env(3, 0, {"SGLANG_SIMULATE_ACC_LEN": "-1"}) is None  # SGLang's "off"
    f = ForcedAcceptance.from_env(3, 0, {"SGLANG_SIMULATE_ACC_LEN": "2.5", "SGLANG_SIMULATE_ACC_METHOD": "multinomial"})
    assert (f.accept_len, f.method, f.token_mode) == (2.5, "multinomial", "fixed")
    with pytest.raises(ValueError, match="SGLANG_SIMULATE_ACC_LEN='x'"):
        ForcedAcceptance.from_env(3, 0, {"SGLANG_SIMULATE_ACC_LEN": "x"})
    with pytest.raises(ValueError, match="SGLANG_SIMULATE_ACC_TOKEN_MODE='zero'"):
        ForcedAcceptance.from_env(3, 0, {"SGLANG_SIMULATE_ACC_LEN": "2", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "zero"})


@pytest.mark.parametrize(
    "overrides,error,named",
    [
        (
            ["spec.simulate_accept_len=3.5"],
            ConfigError,
            "spec.simulate_accept_len=3.5: must be in [1, spec.steps+1] = [1, 3]",
        ),
        (["spec.simulate_accept_len=0.5"], ConfigError, "spec.simulate_accept_len=0.5"),
        (["spec.simulate_accept_len=nan"], ConfigError, "spec.simulate_accept_len=nan"),
        (["spec.simulate_accept_len=two"], ConfigCompositionException, "spec.simulate_accept_len"),
        (["drafter=none", "spec.simulate_accept_len=2"], ConfigError, "drafter=none: forced acceptance needs"),
        (["+engine.env.SGLANG_SIMULATE_ACC_LEN=2"], ConfigError, "engine.env.SGLANG_SIMULATE_ACC_LEN"),
    ],
)
def test_bad_forcing_fails_at_compose_time_naming_the_key(overrides, error, named):
    with pytest.raises(error) as exc:
        experiment(*overrides)
    assert named in str(exc.value)


def test_the_spec_server_alone_gets_the_env_and_inherited_forcing_is_dropped(monkeypatch):
    cfg = experiment("spec.steps=3", "spec.simulate_accept_len=2.5")
    env = server_extra_env(cfg, None)
    assert {k: v for k, v in env.items() if k.startswith("SGLANG_SIMULATE")} == {
        "SGLANG_SIMULATE_ACC_LEN": "2.5",
        "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
        "SGLANG_SIMULATE_ACC_TOKEN_MODE": "fixed",
    }
    assert not [k for k in server_extra_env(baseline_config(cfg), None) if k.startswith("SGLANG_SIMULATE")]
    assert not [k for k in server_extra_env(experiment(), None) if k.startswith("SGLANG_SIMULATE")]
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")  # a stray shell export must not force a real job
    assert "SGLANG_SIMULATE_ACC_LEN" not in server_env(server_extra_env(experiment(), None))
    assert server_env(env)["SGLANG_SIMULATE_ACC_LEN"] == "2.5"


def test_performance_only_labels_the_forced_spec_record_not_its_baseline(tmp_path):
    ctx = JobContext(out_dir=tmp_path, run_name="spec.simulate_accept_len=2.0", root=ROOT)
    cfg = experiment("spec.simulate_accept_len=2.0")
    spec = new_record(cfg, ctx, "spec", {}, [])
    base = new_record(baseline_config(cfg), ctx, "baseline", {}, [])
    plain = new_record(experiment(), ctx, "spec", {}, [])
    assert results.performance_only(spec) and not results.performance_only(base)
    assert not results.performance_only(plain)
    assert tags_of(spec)["spec_decode.performance_only"] == "true"
    assert "spec_decode.performance_only" not in tags_of(base) | tags_of(plain)
    assert results.PERFORMANCE_ONLY in job_summary(spec).splitlines()[0]
    assert results.PERFORMANCE_ONLY not in job_summary(base)
