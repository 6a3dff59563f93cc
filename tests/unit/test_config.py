"""Real Hydra composition of every config group, and bad overrides refused with the key named."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from spec_decode.core.config import ConfigError, register_configs, to_experiment
from spec_decode.engines import server_command, server_extra_env

pytestmark = pytest.mark.unit
CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def experiment(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_experiment(compose("config", overrides=list(overrides)))


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_defaults_are_the_embedded_spec_job():
    cfg = experiment()
    assert (cfg.engine.name, cfg.hardware.name, cfg.drafter.name, cfg.nccl.name) == (
        "embedded",
        "cpu",
        "tiny_eagle3",
        "default",
    )
    assert (cfg.spec.steps, cfg.spec.topk, cfg.spec.num_draft_tokens) == (2, 1, 3)
    assert (cfg.benchmark.warmup, cfg.benchmark.runs, cfg.benchmark.max_new_tokens) == (1, 5, 500)
    assert cfg.speculative


def yaml_values(path: Path) -> dict:
    """An option file's own values (its defaults list and comments left out)."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    data.pop("defaults", None)
    return data


def assert_subset(want: dict, got, where: str) -> None:
    for key, value in want.items():
        have = getattr(got, key) if not isinstance(got, dict) else got[key]
        if isinstance(value, dict) and value:
            assert_subset(value, have, f"{where}.{key}")
        elif value is not None:  # null in a file: derived or unset (spec.num_draft_tokens)
            assert have == value, f"{where}.{key}: composed {have!r}, the file says {value!r}"


@pytest.mark.parametrize("group", ["hardware", "nccl", "drafter", "spec", "model", "engine", "benchmark", "tracking"])
def test_every_option_of_every_group_composes_to_its_files_values(group):
    for option in options(group):
        extra = []
        if group == "engine" and option == "sglang":
            extra = ["hardware=h200x1"]  # SGLang's EAGLE-3 path needs GPUs
        if group == "drafter" and option.startswith("kimi_k25"):
            extra = ["model=kimi_k25"]  # its layer ids are those of a 61-layer target
        # a synthetic pair: each side's layer ids / shapes are the other's
        if group == "drafter" and (CONF / "model" / f"{option.removesuffix('_eagle3')}.yaml").exists():
            extra = [f"model={option.removesuffix('_eagle3')}"]
        if group == "model" and (CONF / "drafter" / f"{option}_eagle3.yaml").exists():
            extra = [f"drafter={option}_eagle3"]
        cfg = experiment(f"{group}={option}", *extra)
        want = yaml_values(CONF / group / f"{option}.yaml")
        assert want, f"{group}/{option}.yaml sets nothing"
        assert_subset(want, getattr(cfg, group), group)


def test_each_engine_composes_to_its_own_schema():
    from spec_decode.core.engine_config import EmbeddedEngineConfig, SglangEngineConfig

    embedded, sglang = experiment(), experiment("engine=sglang", "hardware=h200x1")
    assert type(embedded.engine) is EmbeddedEngineConfig and type(sglang.engine) is SglangEngineConfig
    assert not hasattr(embedded.engine, "enable_metrics")  # SGLang's knobs live with SGLang
    assert not hasattr(embedded.engine, "pcie_ipc_allreduce")
    # the embedded engine's static path has SGLang's graph cap too (issue 26); null = max_running_requests
    assert embedded.engine.cuda_graph_max_bs_decode is None
    assert embedded.engine.cuda_eager_batching is False  # CUDA: the static path unless asked (issue 28)
    assert sglang.engine.cuda_graph_max_bs_decode == 4


def test_every_experiment_composes_to_its_name_and_sweep():
    for option in options("experiment"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            raw = compose("config", overrides=[f"experiment={option}"], return_hydra_config=True)
        want = OmegaConf.load(CONF / "experiment" / f"{option}.yaml")
        assert experiment(f"experiment={option}").name == want.name == option
        assert dict(raw.hydra.sweeper.params) == dict(want.hydra.sweeper.params), option


def test_num_draft_tokens_is_derived_and_never_disagrees():
    for steps in (1, 2, 3, 5):
        cfg = experiment(f"spec.steps={steps}")
        assert cfg.spec.num_draft_tokens == steps + 1
        argv = server_command(cfg, 30000)
        i = argv.index("--speculative-num-draft-tokens")
        assert argv[i + 1] == str(steps + 1)
    with pytest.raises(ConfigError, match=r"spec.num_draft_tokens=7 disagrees with spec.steps=2"):
        experiment("spec.num_draft_tokens=7")


def test_nccl_env_goes_to_the_server_only():
    tuned = experiment("nccl=tuned")
    env = server_extra_env(tuned, None)
    assert {k: env[k] for k in env if k.startswith("NCCL_")} == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
    assert not [k for k in server_extra_env(experiment("nccl=default"), None) if k.startswith("NCCL_")]


def test_baseline_has_no_speculative_flags():
    cfg = experiment("drafter=none", "spec.steps=3")  # the contradiction resolves to the baseline
    assert not cfg.speculative
    argv = server_command(cfg, 30000)
    assert not [a for a in argv if a.startswith("--speculative")]


def test_sglang_argv_uses_current_flag_names():
    cfg = experiment(
        "engine=sglang", "hardware=rtx_pro_6000x8", "model=kimi_k25", "drafter=kimi_k25_eagle3", "spec.steps=3"
    )
    argv = server_command(cfg, 30000)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert "--cuda-graph-max-bs-decode" in argv and "--cuda-graph-max-bs" not in argv
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert "--random-seed" in argv
    for flag, value in (
        ("--speculative-num-steps", "3"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-num-draft-tokens", "4"),
        ("--speculative-algorithm", "EAGLE3"),
    ):
        assert argv[argv.index(flag) + 1] == value


def test_a_model_with_its_own_code_gets_trust_remote_code_once():
    kimi = ["engine=sglang", "hardware=rtx_pro_6000x8", "model=kimi_k25", "drafter=kimi_k25_eagle3"]
    assert server_command(experiment(*kimi), 30000).count("--trust-remote-code") == 1
    # given by hand as well (the README's old form): still once
    assert (
        server_command(experiment(*kimi, "engine.extra_args=[--trust-remote-code]"), 30000).count("--trust-remote-code")
        == 1
    )
    plain = experiment("engine=sglang", "hardware=h200x1", "model=llama31_8b_shape", "drafter=llama31_8b_shape_eagle3")
    assert "--trust-remote-code" not in server_command(plain, 30000)  # a model without code of its own


BAD = [
    (["spec.steps=0"], ConfigError, "spec.steps=0"),
    (["spec.steps=three"], ConfigCompositionException, "spec.steps=three"),
    (["spec.topk=0"], ConfigError, "spec.topk=0"),
    (["spec.topk=4"], ConfigError, "spec.num_draft_tokens"),
    (["spec.topk=2", "spec.num_draft_tokens=3"], ConfigError, "spec.topk=2: engine=embedded drafts chains only"),
    (["engine.enable_metrics=true"], ConfigCompositionException, "engine.enable_metrics"),  # SGLang's only
    (["nccl=fast"], ConfigCompositionException, "nccl"),
    (["benchmark.runs=0"], ConfigError, "benchmark.runs=0"),
    (["benchmark.max_new_tokens=-5"], ConfigError, "benchmark.max_new_tokens"),
    (["benchmark.warmup=-1"], ConfigError, "benchmark.warmup"),
    (["benchmark.temperature=0.7"], ConfigError, "benchmark.temperature"),
    (["benchmark.runs=many"], ConfigCompositionException, "benchmark.runs=many"),
    (["drafter=kimi_k25_eagle3"], ConfigError, "model=tiny_llama has 6 layers"),
    (["hardware=h200x8", "engine=sglang", "hardware.tp_size=16"], ConfigError, "hardware.tp_size=16"),
    (["engine=sglang"], ConfigError, "engine=sglang with hardware=cpu"),
    (["hardware.tp_size=0"], ConfigError, "hardware.tp_size=0"),
    (["engine.port=70000"], ConfigError, "engine.port"),
    (["engine=vllm"], ConfigCompositionException, "engine"),
    (["spec.bogus=1"], ConfigCompositionException, "bogus"),
    (["drafter.layer_ids=[1,1,2]"], ConfigError, "drafter.layer_ids"),
    (["drafter.layer_ids=[-2,3,4]"], ConfigError, "ids are >= -1 (-1 captures the embedding output"),
    (["drafter.layer_ids=[1,3,5]"], ConfigError, "0..4"),
    (["engine.decode_log_interval=0"], ConfigError, "engine.decode_log_interval"),
    (["engine.request_timeout_s=-5"], ConfigError, "engine.request_timeout_s=-5.0: must be > 0 seconds"),
    (["engine.shutdown_grace_s=0"], ConfigError, "engine.shutdown_grace_s=0.0: must be > 0 seconds"),
    (["hardware.device=tpu"], ConfigError, "hardware.device"),
    (["benchmark.concurrency=0"], ConfigError, "benchmark.concurrency=0: must be >= 1"),
    (["benchmark.request_rate=0"], ConfigError, "benchmark.request_rate=0.0: must be > 0"),
    (["benchmark.request_rate=-2.5"], ConfigError, "benchmark.request_rate=-2.5"),
    (["benchmark.request_rate=inf"], ConfigError, "benchmark.request_rate=inf"),
    (
        ["benchmark.concurrency=8", "benchmark.load_requests=4"],
        ConfigError,
        "benchmark.load_requests=4 is below benchmark.concurrency=8",
    ),
    (["benchmark.concurrency=four"], ConfigCompositionException, "benchmark.concurrency=four"),
]


@pytest.mark.parametrize("overrides,error,named", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_overrides_fail_at_compose_time_naming_the_key(overrides, error, named):
    with pytest.raises(error) as exc:
        experiment(*overrides)
    assert named in str(exc.value)


def test_an_unsupported_sglang_is_refused_naming_it_and_the_supported_ones():
    from spec_decode.engines.sglang import SUPPORTED, TESTED_VERSION, version_error

    assert set(SUPPORTED) == {"0.5.23", "0.5.17"} and TESTED_VERSION in SUPPORTED
    msg = version_error("0.5.10")
    assert msg is not None and "sglang 0.5.10 is installed" in msg
    assert "supports sglang 0.5.17, 0.5.23 only" in msg and "pip install" in msg
    assert version_error("0.5.170") is not None  # a whole version, not a prefix
    for v in SUPPORTED:  # a supported release: no refusal
        assert version_error(v) is None


def test_the_doctor_version_item_reads_the_same_table():
    from spec_decode.runner.doctor import check_version

    for v in ("0.5.23", "0.5.17"):
        item = check_version("sglang", v)
        assert item.ok and item.detail == f"sglang {v} (supported: 0.5.23, 0.5.17)", item
    bad = check_version("sglang", "0.5.10")
    assert not bad.ok and "0.5.10 is not supported" in bad.detail and "sglang==0.5.17" in bad.fix


def test_each_release_writes_its_own_nccl_env_for_the_ranks():
    """0.5.17 writes no NCCL_GRAPH_REGISTER and, deterministic, only NCCL_ALGO (engines.sglang.SUPPORTED)."""
    from spec_decode.engines.sglang import rank_nccl_env

    det = ["--enable-deterministic-inference"]
    new = rank_nccl_env({}, 2, det, release="0.5.23")
    old = rank_nccl_env({}, 2, det, release="0.5.17")
    assert new == {
        "NCCL_CUMEM_ENABLE": "0",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_GRAPH_REGISTER": "0",
        "NCCL_ALGO": "allreduce:tree",
        "NCCL_MIN_NCHANNELS": "8",
        "NCCL_MAX_NCHANNELS": "8",
    }
    assert old == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "allreduce:tree"}


def test_concurrency_defaults_keep_the_one_request_protocol():
    b = experiment().benchmark
    assert (b.concurrency, b.request_rate, b.load, b.under_load) == (1, None, None, False)
    b = experiment("benchmark.concurrency=4").benchmark
    assert (b.under_load, b.requests_per_run) == (True, 16)
    assert experiment("benchmark.request_rate=2.5").benchmark.under_load  # open loop at concurrency 1
    assert experiment("benchmark.load=true").benchmark.under_load  # a sweep's concurrency 1, measured alike
    assert not experiment("benchmark.concurrency=4", "benchmark.load=false").benchmark.under_load
