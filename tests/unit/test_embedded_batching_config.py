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
    with pytest.raises(ConfigError, match=r"engine.proj_split=-1: must be >= 0"):
        compose_experiment("engine=embedded", "engine.proj_split=-1")
