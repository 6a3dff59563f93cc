"""What we generate, checked by SGLang 0.5.23's own code: argv parser, request schema, plugin hooks."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from spec_decode.core.config import register_configs, to_experiment
from spec_decode.engines import server_command
from spec_decode.engines.embedded.request import SAMPLING_KEYS
from spec_decode.runner.client import Client

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
register_configs()


def all_sglang_jobs():
    """Every hardware x nccl x drafter x spec combination in conf/, on engine=sglang. Hydra composes each
    hardware x nccl x drafter once (~90 ms a composition: 336 of them took 30 s); the step count is set
    on the composed config, as the override would (the typed config and its rules see it either way)."""
    opts = lambda g: sorted(p.stem for p in (CONF / g).glob("*.yaml"))  # noqa: E731
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        gpu_profiles = [h for h in opts("hardware") if h != "cpu"]  # SGLang is refused on CPU
        for hw, nccl, drafter in itertools.product(gpu_profiles, opts("nccl"), opts("drafter")):
            paired = drafter.removesuffix("_eagle3")  # a synthetic drafter's own target (same shapes)
            model = (
                "kimi_k25"
                if drafter.startswith("kimi_k25")
                else paired
                if (CONF / "model" / f"{paired}.yaml").exists()
                else "tiny_llama"
            )
            cfg = compose(
                "config",
                overrides=["engine=sglang", f"hardware={hw}", f"nccl={nccl}", f"drafter={drafter}", f"model={model}"],
            )
            for steps in (1, 2, 3, 5):
                cfg.spec.steps = steps
                yield to_experiment(cfg)


def test_every_generated_argv_passes_sglangs_own_parser(sglang_args):
    jobs = {}
    for cfg in all_sglang_jobs():
        argv = server_command(cfg, 30000)
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        jobs.setdefault(tuple(argv[3:]), cfg)
    assert len(jobs) >= 8
    results = sglang_args([list(k) for k in jobs])
    for (argv, cfg), got in zip(jobs.items(), results):
        assert "exit" not in got, (argv, got)
        assert got["tp_size"] == cfg.hardware.tp_size
        assert got["random_seed"] == cfg.engine.random_seed
        if cfg.speculative:
            assert got["speculative_algorithm"] == "EAGLE3"
            assert (
                got["speculative_num_steps"],
                got["speculative_eagle_topk"],
                got["speculative_num_draft_tokens"],
            ) == (cfg.spec.steps, 1, cfg.spec.steps + 1)
        else:
            assert got["speculative_algorithm"] is None


def test_the_load_axis_argv_passes_sglangs_parser_with_its_caps(sglang_args):
    """benchmark.concurrency needs the server's running cap and graph cap (issue 28): SGLang's own parser
    reads our --max-running-requests and --cuda-graph-max-bs-decode as the values preflight checked."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = to_experiment(
            compose(
                "config",
                overrides=[
                    "engine=sglang",
                    "hardware=h200x1",
                    "benchmark.concurrency=32",
                    "engine.max_running_requests=32",
                    "engine.cuda_graph_max_bs_decode=32",
                ],
            )
        )
    (got,) = sglang_args([server_command(cfg, 30000)[3:]])
    assert "exit" not in got, got
    assert (got["max_running_requests"], got["cuda_graph_max_bs_decode"]) == (32, 32)


def test_a_wrong_flag_fails_sglangs_parser(sglang_args):
    bad = [["--model-path", "m", "--cuda-graph-max-bs", "8"], ["--model-path", "m", "--speculative-num-stepz", "2"]]
    for got in sglang_args(bad):
        assert got.get("exit") == 2, got


def test_our_generate_body_passes_sglangs_request_schema(api_types):
    body = Client("http://x", 1).generate_body("The robot sleeps. ", 500, 0.0, True)
    req = api_types.GenerateRequest.from_json_value(body)
    assert req.sampling_params.max_new_tokens == 500 and req.sampling_params.ignore_eos is True
    with pytest.raises(Exception, match="max_tokens"):
        api_types.GenerateRequest.from_json_value({"text": "x", "sampling_params": {"max_tokens": 5}})


def test_embedded_engine_accepts_exactly_sglangs_sampling_keys(api_types):
    assert set(SAMPLING_KEYS) == set(api_types.SamplingParams.__struct_fields__)


def test_every_hook_target_exists_with_a_compatible_signature(sglang_args):
    """Read from the installed SGLang's source (importing the worker needs real triton kernels), by
    the same code the first-contact self-check runs on a GPU box."""
    from spec_decode.profiler.plugin import TARGETS
    from spec_decode.runner.doctor import check_hook_targets

    item = check_hook_targets("sglang")
    assert item.ok, item.detail
    renamed = [(TARGETS["sglang"][0][0] + "_renamed", None), *TARGETS["sglang"][1:]]
    bad = check_hook_targets("sglang", renamed)
    assert not bad.ok and "forward_batch_generation_renamed not in" in bad.detail and "TARGETS" in bad.fix


HOOK_SCRIPT = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import sglang.srt.plugins.hook_registry as hr
from sglang.srt.plugins.hook_registry import HookRegistry
from spec_decode.profiler import plugin
import types
# A stand-in module with the worker's method names, so the real HookRegistry wraps real callables.
mod = types.ModuleType("fake_worker"); sys.modules["fake_worker"] = mod
class Result: accept_lens = [3]
class EagleDraftWorker:
    def draft(self, batch): time.sleep(0.002); return "drafts"
    def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None): time.sleep(0.001)
class EAGLEWorkerV2:
    def __init__(self): self.draft_worker = EagleDraftWorker()
    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None): time.sleep(0.003); return Result()
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        self.draft_worker.draft(batch); r = self.verify(batch); self.draft_worker._draft_extend_for_decode(batch, r); return r
mod.EagleDraftWorker, mod.EAGLEWorkerV2 = EagleDraftWorker, EAGLEWorkerV2
plugin.TARGETS["sglang"] = tuple((t.replace(plugin.SGLANG_MODULE, "fake_worker"), p)
                                 for t, p in plugin.TARGETS["sglang"])
plugin.register()
HookRegistry.apply_hooks()
w = EAGLEWorkerV2()
outs = [w.forward_batch_generation(None) for _ in range(3)]
assert all(isinstance(o, Result) for o in outs)
import atexit; atexit._run_exitfuncs()
print(json.dumps({"wrapped": EAGLEWorkerV2.verify.__name__}))
"""


def test_plugin_registers_through_sglangs_hook_registry_and_records(sglang_args, tmp_path):
    out = tmp_path / "profile.jsonl"
    env = {
        **os.environ,
        "SPEC_DECODE_PROFILE": str(out),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "stubs"), str(ROOT)]),
    }
    p = subprocess.run(
        [sys.executable, "-c", HOOK_SCRIPT, str(ROOT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "profile.dp0.tp0.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and {x["rank"] for x in lines} == {0}
    for rec in lines:
        assert rec["verify_ms"] >= 2.5 and rec["draft_ms"] >= 1.5 and rec["extend_ms"] >= 0.5
        assert rec["cycle_ms"] >= rec["draft_ms"] + rec["verify_ms"] + rec["extend_ms"]
        assert rec["accepted"] == 3


INERT_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from sglang.srt.plugins.hook_registry import HookRegistry
from spec_decode.profiler import plugin
os.environ.pop("SPEC_DECODE_PROFILE", None)
plugin.register()
print("HOOKS", sum(len(v) for v in HookRegistry._hooks.values()))
"""


def test_plugin_is_inert_without_the_env_var(sglang_args):
    env = {k: v for k, v in os.environ.items() if k != "SPEC_DECODE_PROFILE"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "stubs"), str(ROOT)])
    p = subprocess.run(
        [sys.executable, "-c", INERT_SCRIPT, str(ROOT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "HOOKS 0" in p.stdout
