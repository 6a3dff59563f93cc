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
