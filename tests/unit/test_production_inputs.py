"""The production path's bad input, refused before any server starts (a new user's review, 2026-12-06):
flags in engine.extra_args that a config key owns, SGLang's caps below 1, a hub id that is not in the
local cache, an override Hydra cannot parse, the doctor's answer to a typo, long job dir names, a drafter
config without its vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from spec_decode.core import drafter
from spec_decode.core.config import ConfigError, dir_name, register_configs, to_experiment
from spec_decode.engines import server_command
from spec_decode.runner import doctor, hub_cache, preflight, preflight_items

from ..conftest import run_py

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
register_configs()
SGLANG = ("engine=sglang", "hardware=h200x8")


def experiment(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_experiment(compose("config", overrides=list(overrides)))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ((*SGLANG, "engine.extra_args=[--tp-size,4]"), "hardware.tp_size"),
        ((*SGLANG, "engine.extra_args=[--tp,4]"), "hardware.tp_size"),  # argparse takes the unique prefix
        ((*SGLANG, "engine.extra_args=[--cuda-graph-max-bs,8]"), "engine.cuda_graph_max_bs_decode"),  # ambiguous
        ((*SGLANG, "engine.extra_args=[--tensor-parallel-size,4]"), "hardware.tp_size"),  # SGLang's alias
        ((*SGLANG, "engine.extra_args=[--speculative-num-steps,7]"), "spec.steps"),
        ((*SGLANG, "engine.extra_args=['--max-running-requests=8']"), "engine.max_running_requests"),
        ((*SGLANG, "engine.extra_args=[--load-format,dummy,--model,x]"), "model.path"),
        (("engine.extra_args=['--device=cuda']",), "hardware.device"),
        (("engine.extra_args=[--cpu-threads,'1',--proj-split,4]",), "engine.proj_split"),
    ],
)
def test_a_flag_that_a_key_owns_is_refused_in_extra_args_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        experiment(*overrides)
    assert f"the runner sets this flag from {key}; set that key instead" in str(e.value) or (
        f", which the runner sets from {key}; set that key instead" in str(e.value)  # a prefix of the flag
    )


@pytest.mark.parametrize(
    "overrides",
    [
        ("hardware=h200x1", "engine.torch_compile=true", "engine.proj_split=4", "engine.cuda_graph_max_bs_decode=4"),
        ("hardware=h200x1", "engine.cuda_eager_batching=true", "engine.disable_overlap_schedule=true"),
        (*SGLANG, "engine.max_running_requests=8", "engine.enable_metrics=true"),
    ],
)
def test_every_flag_the_runner_passes_is_one_a_key_owns(overrides):
    """OWNED_FLAGS lists what engines.common_flags and each engine's engine_flags pass: a flag added there and
    not here could be given twice through engine.extra_args."""
    cfg = experiment(*overrides)
    argv = server_command(cfg, 30000)[len(cfg.engine.launcher) : -len(cfg.engine.extra_args) or None]
    flags = {a for a in argv if a.startswith("--")} - {"--trust-remote-code"}  # either (engines.sglang)
    assert flags and flags <= set(type(cfg.engine).OWNED_FLAGS), flags - set(type(cfg.engine).OWNED_FLAGS)


def test_extra_args_that_no_key_owns_pass_verbatim():
    cfg = experiment(*SGLANG, "engine.extra_args=[--disable-overlap-schedule,--load-format,dummy]")
    argv = server_command(cfg, 30000)
    assert argv[-3:] == ["--disable-overlap-schedule", "--load-format", "dummy"]
    assert argv.count("--tp-size") == 1
    experiment("engine.extra_args=[--cpu-threads,'2']")  # the embedded default's own flag


@pytest.mark.parametrize("key", ["max_running_requests", "cuda_graph_max_bs_decode"])
@pytest.mark.parametrize("value", [0, -5])
def test_sglang_caps_below_one_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"engine.{key}={value}: must be >= 1"):
        experiment(*SGLANG, f"engine.{key}={value}")


def _hub_errors(monkeypatch, env: dict[str, str], path: str = "acme/llama-x", *extra: str) -> list[str]:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = experiment(*SGLANG, "drafter=none", f"model.path={path}", *extra)
    return [e for e in preflight.check(cfg, ROOT).errors if "model.path=" in e]


def _cache(hub: Path, refs_main: bool = True, weights: bool = True) -> Path:
    """models--acme--llama-x in the cache ``hub``, as huggingface_hub lays it out."""
    snap = hub / "models--acme--llama-x" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    if weights:
        (snap / "model.safetensors").touch()
    if refs_main:
        (snap.parents[1] / "refs").mkdir()
        (snap.parents[1] / "refs" / "main").write_text("abc123")
    return hub


def test_a_hub_id_not_in_the_local_cache_is_refused_and_one_there_passes(tmp_path, monkeypatch):
    (err,) = _hub_errors(monkeypatch, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert "model.path=acme/llama-x is neither a local directory" in err
    assert str(tmp_path / "hub" / "models--acme--llama-x") in err and "HF_HUB_OFFLINE=1" in err
    assert "hf download acme/llama-x" in err
    assert _hub_errors(monkeypatch, {"HF_HUB_CACHE": str(_cache(tmp_path / "hub"))}) == []


def test_a_snapshot_without_refs_main_is_not_found(tmp_path, monkeypatch):
    """Offline, the revision "main" resolves through refs/main alone: a snapshot without it does not load."""
    (err,) = _hub_errors(monkeypatch, {"HF_HUB_CACHE": str(_cache(tmp_path / "hub", refs_main=False))})
    assert "refs/main" in err


def test_a_snapshot_with_its_config_alone_is_not_found(tmp_path, monkeypatch):
    """`hf download org/x config.json` fetched no weights: the offline server would fail to load."""
    (err,) = _hub_errors(monkeypatch, {"HF_HUB_CACHE": str(_cache(tmp_path / "hub", weights=False))})
    assert "holds config.json and weights" in err


def test_a_hub_shaped_path_that_dvc_tracks_gets_the_dvc_answer(tmp_path):
    """weights/llama (its folder not pulled yet, a DVC stage's output) is a local path: `dvc pull` it."""
    subprocess.run("git init -q && dvc init -q", shell=True, cwd=tmp_path, check=True)
    (tmp_path / "dvc.yaml").write_text("stages:\n  make:\n    cmd: echo\n    outs:\n      - weights/llama\n")
    pf = preflight_items.Preflight()
    local = tmp_path / "weights" / "llama"
    assert hub_cache.is_hub_id("weights/llama", local, tmp_path)
    hub_cache.check_hub_model("weights/llama", local, tmp_path, pf, False, {"HF_HUB_CACHE": str(tmp_path / "h")})
    assert pf.errors == [
        "model.path=weights/llama: weights not found (config.json + *.safetensors); run `dvc pull weights/llama`"
    ]


@pytest.mark.parametrize("path", ["org/", "C:/x", "a b/c", "-x/y", "org/na:me", "a--b/c", "a/b..c", "~/x", "/abs/x"])
def test_only_a_repo_id_is_taken_for_a_hub_id(path, tmp_path):
    assert not hub_cache.is_hub_id(path, tmp_path / "nothing", tmp_path)
    assert hub_cache.is_hub_id("meta-llama/Llama-3.1-8B", tmp_path / "nothing", tmp_path)


def test_the_cache_is_the_servers_in_huggingface_hubs_order(tmp_path, monkeypatch):
    hub = _cache(tmp_path / "home" / "hub")
    assert _hub_errors(monkeypatch, {"HF_HOME": str(tmp_path / "home")}) == []
    assert _hub_errors(monkeypatch, {"HUGGINGFACE_HUB_CACHE": str(hub)}) == []
    # HF_HUB_CACHE comes first: set to an empty cache, the model is not found
    assert _hub_errors(monkeypatch, {"HUGGINGFACE_HUB_CACHE": str(hub), "HF_HUB_CACHE": str(tmp_path / "e")})
    # the server's environment: engine.env names the cache for it alone, and its $VARS expand from there
    assert _hub_errors(monkeypatch, {}, "acme/llama-x", f"+engine.env.HF_HOME={tmp_path / 'home'}") == []
    env = ("+engine.env.HF_HUB_CACHE=\\${X}/hub", f"+engine.env.X={tmp_path / 'home'}")
    assert _hub_errors(monkeypatch, {}, "acme/llama-x", *env) == []


def test_a_missing_path_under_a_local_folder_is_a_local_path_not_a_hub_id(tmp_path, monkeypatch):
    """models/kimi-k25 (a typo of a local dir; models/ is here) gets the local missing-weights answer."""
    (err,) = _hub_errors(monkeypatch, {"HF_HUB_CACHE": str(tmp_path / "hub")}, "models/kimi-k25")
    assert "model.path=models/kimi-k25: weights not found" in err and "Hugging Face" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["spec.step=3"],
        ["nccl=tunned"],
        ["engine=sglang"],
        ["engine=sglang", "hardware=h200x8", "engine.max_running_requests=0"],
    ],
)
def test_the_doctor_answers_bad_overrides_with_one_line_and_exit_2(args):
    p = subprocess.run(
        [sys.executable, "-m", "spec_decode.runner.doctor", "--static-only", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.startswith("error: "), p.stderr


def test_run_py_names_an_override_that_hydra_cannot_parse():
    p = run_py(["spec.steps=2", "engine.extra_args=[--device=cuda]", "dry_run=true"], check=False, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("error: engine.extra_args=[--device=cuda] (") and "quote a value" in p.stderr


def test_long_job_dir_names_keep_every_value():
    name = "drafter=kimi_k25_eagle3,engine=sglang,hardware=rtx_pro_6000x8,model=kimi_k25,nccl=default,spec.steps=1"
    assert len(name) > 100
    assert dir_name(name) == name  # <= 120 characters: as is
    longer = name + ",benchmark.runs=3,benchmark.warmup=1"
    short = dir_name(longer)  # the keys' heads dropped, every value kept, a hash of the whole
    assert short.startswith(name.replace("spec.steps=", "steps=") + ",runs=3,warmup=1~") and len(short) <= 120
    assert dir_name("+" + longer) != short  # two jobs that shorten alike keep apart by the hash
    same = "benchmark.runs=2,engine.runs=3," + "x" * 120  # two keys end the same: head and hash
    assert len(dir_name(same)) == 120 and dir_name(same).startswith("benchmark.runs=2,engine.runs=3,")


def test_a_drafter_config_without_its_vocab_says_so():
    target = {"hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 4}
    problems = drafter.problems({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}, target, "d.json")
    assert any("the drafter's config.json has no vocab_size (an integer)" in p for p in problems), problems
    assert not any("exceeds" in p or "None" in p for p in problems), problems


def test_a_missing_hook_module_is_named_once(tmp_path):
    (tmp_path / "sglang").mkdir()  # a source tree without the worker's module
    item = doctor.check_hook_targets("sglang", root=tmp_path)
    assert not item.ok and item.detail.count("is not installed") == 1, item.detail
