"""The embedded engine's scheduling keys through real Hydra composition: the server command line and
the error for a bad cap (issue 26)."""

import pytest

from spec_decode.core.config import ConfigError
from spec_decode.engines import server_command

from ..conftest import compose_experiment


def test_scheduling_keys_reach_the_server_command():
    argv = server_command(compose_experiment("engine=embedded"), 30000)
    i = argv.index("--max-running-requests")
    assert argv[i + 1] == "16" and "--disable-overlap-schedule" not in argv  # overlap on by default
    argv = server_command(
        compose_experiment("engine=embedded", "engine.max_running_requests=4", "engine.disable_overlap_schedule=true"),
        30000,
    )
    i = argv.index("--max-running-requests")
    assert argv[i + 1] == "4" and "--disable-overlap-schedule" in argv


def test_a_cap_below_one_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"engine.max_running_requests=0: must be >= 1"):
        compose_experiment("engine=embedded", "engine.max_running_requests=0")


def test_torch_compile_reaches_the_server_command_on_cuda_and_is_refused_on_cpu():
    argv = server_command(compose_experiment("engine=embedded", "hardware=h200x1", "engine.torch_compile=true"), 30000)
    assert "--enable-torch-compile" in argv
    assert "--enable-torch-compile" not in server_command(compose_experiment("engine=embedded", "hardware=h200x1"), 1)
    with pytest.raises(ConfigError, match=r"engine.torch_compile=true with hardware=cpu .*CUDA"):
        compose_experiment("engine=embedded", "engine.torch_compile=true")
    with pytest.raises(ConfigError, match=r"engine.torch_compile=true .*engine.cuda_eager_batching=true"):
        compose_experiment(
            "engine=embedded", "hardware=h200x1", "engine.torch_compile=true", "engine.cuda_eager_batching=true"
        )
    with pytest.raises(ConfigError, match=r"engine.torch_compile=true with hardware.tp_size=2"):
        compose_experiment("engine=embedded", "hardware=h200x2", "engine.torch_compile=true")


def test_proj_split_reaches_the_server_command_with_compile_only():
    on = compose_experiment("engine=embedded", "hardware=h200x1", "engine.torch_compile=true", "engine.proj_split=4")
    argv = server_command(on, 30000)
    assert argv[argv.index("--proj-split") + 1] == "4"
    assert "--proj-split" not in server_command(compose_experiment("engine=embedded", "hardware=h200x1"), 1)
    with pytest.raises(ConfigError, match=r"engine.proj_split=4: .*set engine.torch_compile=true"):
        compose_experiment("engine=embedded", "hardware=h200x1", "engine.proj_split=4")
    for bad in (-1, 1):
        with pytest.raises(ConfigError, match=rf"engine.proj_split={bad}: must be 0 \(off\) or >= 2"):
            compose_experiment("engine=embedded", f"engine.proj_split={bad}")


def test_the_split_rule_reads_the_engines_widths_and_names_counts_that_fit():
    from spec_decode.core.shapes import proj_split_problem

    llama8b = {"num_attention_heads": 32, "hidden_size": 4096, "intermediate_size": 14336, "head_dim": 128}
    assert proj_split_problem(4, llama8b) is None and proj_split_problem(0, llama8b) is None
    assert proj_split_problem(3, llama8b).endswith("use one of 2, 4, 8, 16")
    # the engine's head dim is hidden / heads (its LlamaShape), whatever a config's head_dim says
    assert (
        proj_split_problem(16, {"num_attention_heads": 8, "hidden_size": 256, "intermediate_size": 512, "head_dim": 3})
        is None
    )
    odd = {"num_attention_heads": 6, "hidden_size": 192, "intermediate_size": 510}  # gcd 6
    assert proj_split_problem(4, odd) == (
        "o_proj's input width (192) and down_proj's (510) must both divide by it; use one of 2, 3, 6"
    )
    assert proj_split_problem(2, {**odd, "intermediate_size": 511}).endswith("no split count > 1 divides both: use 0")
    assert proj_split_problem(4, {"hidden_size": 192}) is None  # not this engine's shape: its loader says what
