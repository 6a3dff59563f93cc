"""Preflight refuses bad input before any server starts, naming the key or file; the drift guard flags
a baseline whose server lost its NCCL variables (real processes, a real MLflow store)."""

import json
import shutil

import pytest

from ..conftest import DRAFTER, ROOT, run_py, small

pytestmark = pytest.mark.integration


def drafter_copy(tmp_path, edit_config=None, edit_record=None, raw=None):
    d = tmp_path / "drafter"
    shutil.copytree(DRAFTER, d)
    if raw is not None:
        (d / "config.json").write_text(raw)
    if edit_config:
        cfg = json.loads((d / "config.json").read_text())
        edit_config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if edit_record:
        rec = json.loads((d / "training.json").read_text())
        edit_record(rec)
        (d / "training.json").write_text(json.dumps(rec))
    return d


def refused(tmp_path, *overrides) -> str:
    p = run_py([*overrides, "tracking=off", f"hydra.run.dir={tmp_path / 'job'}"], check=False)
    assert p.returncode == 2, p.stdout[-1000:] + p.stderr[-2000:]
    assert not list(tmp_path.glob("job/**/server.log")), "a server was started"
    return p.stderr


def test_dp_attention_with_the_profiler_is_refused_with_the_reason(tmp_path):
    err = refused(tmp_path, "spec.steps=2", "engine.extra_args=[--cpu-threads,'1',--enable-dp-attention]")
    assert "--enable-dp-attention with benchmark.profile=true" in err and "benchmark.profile=false" in err


def test_drafter_trained_on_other_layers_is_refused_with_both_lists(tmp_path):
    d = drafter_copy(tmp_path, edit_record=lambda r: r.update(trained_aux_layer_ids=[0, 2, 3]))
    err = refused(tmp_path, f"drafter.path={d}")
    assert "[0, 2, 3]" in err and "[1, 3, 4]" in err and "trained on target layers" in err


def test_served_ids_differing_from_the_config_are_refused(tmp_path):
    d = drafter_copy(tmp_path, edit_config=lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[4, 3, 1]))
    err = refused(tmp_path, f"drafter.path={d}")
    assert "[4, 3, 1]" in err and "[1, 3, 4]" in err


def test_layer_id_mismatch_on_purpose_is_a_warning(tmp_path):
    """preflight.allow_layer_id_mismatch=true (a layer-id experiment serving the seed's bug on purpose):
    both mismatches are warnings naming the override; other drafter errors still stop the job."""
    d = drafter_copy(tmp_path, edit_config=lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[4, 3, 1]))
    p = run_py([f"drafter.path={d}", "preflight.allow_layer_id_mismatch=true", "dry_run=true", "tracking=off",
                f"hydra.run.dir={tmp_path / 'job'}"])
    warned = [line for line in p.stdout.splitlines()
              if line.startswith("# warning: allowed by preflight.allow_layer_id_mismatch=true")]
    assert len(warned) == 2 and "trained on target layers [1, 3, 4]" in warned[1], p.stdout
    assert "# error" not in p.stdout
    bad = drafter_copy(tmp_path / "b", edit_config=lambda c: c.update(vocab_size=32000))
    assert "vocab_size" in refused(tmp_path / "b", f"drafter.path={bad}", "preflight.allow_layer_id_mismatch=true")


BAD_FILES = {
    "not_eagle3": (lambda c: c.update(architectures=["LlamaForCausalLM"]), None, "LlamaForCausalLMEagle3"),
    "ids_out_of_range": (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 7]),
                         None, "0..4"),
    "hidden_mismatch": (lambda c: c.update(hidden_size=256, target_hidden_size=256), None, "hidden size"),
    "vocab_mismatch": (lambda c: c.update(vocab_size=32000), None, "vocab_size"),
    "malformed_json": (None, "{not json", "not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_drafter_files(tmp_path, case):
    edit, raw, named = BAD_FILES[case]
    d = drafter_copy(tmp_path, edit_config=edit, raw=raw)
    assert named in refused(tmp_path, f"drafter.path={d}", "drafter.layer_ids=null")


def test_missing_and_malformed_prompt_files(tmp_path):
    assert "benchmark.prompts=nope.jsonl" in refused(tmp_path, "benchmark.prompts=nope.jsonl")
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"text": "ok"}\n{"id": 3}\n')
    assert "prompts.jsonl:2" in refused(tmp_path, f"benchmark.prompts={bad}")
    assert "benchmark.prompt_index=42" in refused(tmp_path, "benchmark.prompt_index=42")


def test_nccl_typo_and_overlong_generation(tmp_path):
    assert "NCCL_PROTOCOL is not an NCCL variable" in refused(tmp_path, "+nccl.env.NCCL_PROTOCOL=LL")
    assert "exceed the model's context of 1024" in refused(tmp_path, "benchmark.max_new_tokens=1000")


def test_malformed_experiment_yaml_names_the_file(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "experiment" / "broken.yaml").write_text("# @package _global_\nname: [unclosed\n")
    p = run_py(["--config-dir", str(conf), "experiment=broken", "tracking=off",
                f"hydra.run.dir={tmp_path / 'job'}"], check=False)
    assert p.returncode != 0 and "broken" in p.stderr


def test_drift_guard_flags_a_baseline_that_lost_its_nccl_variables(tmp_path, tmp_store):
    base = ["drafter=none", "nccl=tuned", *small(), *tmp_store["overrides"]]
    for i in range(2):
        run_py([*base, f"hydra.run.dir={tmp_path / f'ok{i}'}"])
    run_py([*base, "engine.launcher=[python,tests/fault_server.py]", "+engine.env.FAULT=drop_nccl",
            f"hydra.run.dir={tmp_path / 'lost'}"])
    rec = json.loads((tmp_path / "lost" / "results.json").read_text())
    assert not [k for k in rec["server_env"] if k.startswith("NCCL_")]  # read back from the live process
    assert rec["drift"]["earlier_runs"] == 2
    assert "NCCL_PROTO was LL in the earlier runs, unset now" in rec["drift"]["env_differences"]
    assert any(w.startswith("DRIFT:") for w in rec["warnings"])
    ok = json.loads((tmp_path / "ok1" / "results.json").read_text())
    assert ok["drift"]["env_differences"] == []
    assert ok["server_env"]["NCCL_PROTO"] == "LL"
