"""Issue 29 (a): a key the schema lacks is refused with a did-you-mean, '+key' included (Hydra's own
hint '+spec.step=3' used to run a full job at the default steps=2)."""

import pytest
from hydra import compose, initialize_config_dir

from spec_decode.core.config import ConfigError, register_configs
from spec_decode.core.overrides import check_argv, check_composed

from ..conftest import ROOT, run_py

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("arg", ["+spec.step=3", "spec.step=3"])
def test_unknown_key_is_refused_with_did_you_mean_before_any_server(arg, tmp_path):
    p = run_py([arg, "dry_run=true", "tracking=off", f"hydra.run.dir={tmp_path}"], check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"error: {arg}: spec has no key 'step'; did you mean spec.steps=3?" in p.stderr, p.stderr
    assert "server command" not in p.stdout + p.stderr  # nothing composed, nothing launched
    assert "Traceback" not in p.stderr


def test_sweep_typo_and_top_level_typo_are_refused():
    with pytest.raises(ConfigError, match=r"spec\.step=1,2: .*did you mean spec\.steps=1,2\?"):
        check_argv(["-m", "spec.step=1,2"])
    with pytest.raises(ConfigError, match=r"did you mean dry_run=true\?"):
        check_argv(["dryrun=true"])


def test_dict_fields_groups_and_hydra_keys_still_pass():
    check_argv(
        [
            "-m",
            "+nccl.env.NCCL_ALGO=Ring",
            "+engine.env.X=1",
            "engine=sglang",
            "spec.steps=1,2",
            "experiment=ci_smoke",
            "hydra.sweep.dir=/tmp/x",
            "engine.cuda_graph_max_bs_decode=8",
            "hydra/launcher=joblib",
        ]
    )


def test_an_added_key_in_a_composed_config_is_refused():
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+spec.step=3"])
        check_composed(compose("config", overrides=["+nccl.env.NCCL_ALGO=Ring"]))
    with pytest.raises(ConfigError, match=r"\+spec\.step: spec has no key 'step'; did you mean spec\.steps=3\?"):
        check_composed(cfg)


@pytest.mark.parametrize(
    "arg, said",
    [
        ("spec.steps=abc", "error: spec.steps=abc: spec.steps takes an integer"),
        ("benchmark.paired=maybe", "error: benchmark.paired=maybe: benchmark.paired takes true or false (or null)"),
        (
            "drafter.layer_ids=abc",
            "error: drafter.layer_ids=abc: drafter.layer_ids takes a list of integers, e.g. "
            "drafter.layer_ids=[1,3,4] (or null)",
        ),
        (
            "hardware=h100x8",
            "error: hardware=h100x8: no such option of hardware; options: cpu, h100x1, h200x1, h200x2, h200x8, rtx_pro_6000x8",
        ),
    ],
)
def test_a_bad_value_or_option_is_exit_2_with_the_key_and_what_it_takes(arg, said, tmp_path):
    """Issue 44: Hydra's own answer was a traceback and exit 1 (the README promises 2 and the key)."""
    p = run_py([arg, "tracking=off", f"hydra.run.dir={tmp_path}"], check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert said in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_bad_value_in_a_sweep_is_refused_before_any_job():
    with pytest.raises(ConfigError, match=r"^spec\.steps=abc: spec\.steps takes an integer"):
        check_argv(["-m", "spec.steps=abc,2"])
    with pytest.raises(ConfigError, match=r"nccl=tunned: no such option of nccl; options: default, no_p2p, tuned"):
        check_argv(["-m", "nccl=tuned,tunned"])
    check_argv(["-m", "spec.steps=range(1,3)", "spec.simulate_accept_len=null,2.5", "nccl=tuned,default"])


def test_options_of_an_extra_config_dir_and_null_for_an_engine_that_allows_it_pass(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nname: mine\n")
    check_argv(["--config-dir", str(tmp_path), "-m", "experiment=mine"])  # Hydra adds the dir: so do we
    with pytest.raises(ConfigError, match="experiment=mine: no such option of experiment"):
        check_argv(["-m", "experiment=mine"])
    check_argv(["engine=sglang", "engine.max_running_requests=null"])  # Optional under one engine's schema
