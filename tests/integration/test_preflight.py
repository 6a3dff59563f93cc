"""Preflight refuses bad input before any server starts, naming the key or file; the drift guard flags
a baseline whose server lost its NCCL variables (real processes, a real MLflow store)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.record import results

from ..conftest import DRAFTER, ROOT, compose_experiment, run_py, small

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
    assert "trained on ids [0, 2, 3] -> captured layers [1, 3, 4]" in err
    assert "served with ids [1, 3, 4] -> captured layers [2, 4, 5]" in err


def test_served_ids_differing_from_the_config_are_refused(tmp_path):
    d = drafter_copy(
        tmp_path, edit_config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[4, 3, 1])
    )
    err = refused(tmp_path, f"drafter.path={d}")
    assert "[4, 3, 1]" in err and "[1, 3, 4]" in err


def test_layer_id_mismatch_on_purpose_is_a_warning(tmp_path):
    """preflight.allow_layer_id_mismatch=true (a layer-id experiment serving the seed's bug on purpose):
    both mismatches are warnings naming the override; other drafter errors still stop the job."""
    d = drafter_copy(
        tmp_path, edit_config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[4, 3, 1])
    )
    p = run_py(
        [
            f"drafter.path={d}",
            "preflight.allow_layer_id_mismatch=true",
            "dry_run=true",
            "tracking=off",
            f"hydra.run.dir={tmp_path / 'job'}",
        ]
    )
    warned = [
        line
        for line in p.stdout.splitlines()
        if line.startswith("# warning: allowed by preflight.allow_layer_id_mismatch=true")
    ]
    assert len(warned) == 2 and "trained on ids [1, 3, 4]" in warned[1], p.stdout
    assert "# error" not in p.stdout
    bad = drafter_copy(tmp_path / "b", edit_config=lambda c: c.update(vocab_size=32000))
    assert "vocab_size" in refused(tmp_path / "b", f"drafter.path={bad}", "preflight.allow_layer_id_mismatch=true")


BAD_FILES = {
    "not_eagle3": (
        lambda c: c.update(architectures=["LlamaForCausalLM"]),
        None,
        "one of ['Eagle3DeepseekV2ForCausalLM', 'LlamaForCausalLMEagle3']",
    ),
    "ids_out_of_range": (
        lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 7]),
        None,
        "captured layers [2, 4, 8] (llama rule), but the 6-layer target has layers 0..5",
    ),
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


def test_a_proj_split_the_target_cannot_take_is_refused_before_any_server_naming_both_sizes():
    from spec_decode.runner import preflight

    def errors(split):
        cfg = compose_experiment("hardware=h200x1", "engine.torch_compile=true", f"engine.proj_split={split}")
        return [e for e in preflight.check(cfg, ROOT).errors if "proj_split" in e]

    assert errors(3) == [
        "engine.proj_split=3: o_proj's input width (192) and down_proj's (512) must both divide by it; "
        "use one of 2, 4, 8, 16"
    ]
    assert errors(4) == [] and errors(0) == []


def test_nccl_typo_and_overlong_generation(tmp_path):
    assert "NCCL_PROTOCOL is not an NCCL variable" in refused(tmp_path, "+nccl.env.NCCL_PROTOCOL=LL")
    assert "exceed the model's context of 1024" in refused(tmp_path, "benchmark.max_new_tokens=1000")


def test_malformed_experiment_yaml_names_the_file(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "experiment" / "broken.yaml").write_text("# @package _global_\nname: [unclosed\n")
    p = run_py(
        ["--config-dir", str(conf), "experiment=broken", "tracking=off", f"hydra.run.dir={tmp_path / 'job'}"],
        check=False,
    )
    assert p.returncode != 0 and "broken" in p.stderr


def test_drift_guard_flags_a_baseline_that_lost_its_nccl_variables(tmp_path, tmp_store):
    base = ["drafter=none", "nccl=tuned", *small("benchmark.profile=false"), *tmp_store["overrides"]]
    for i in range(2):
        run_py([*base, f"hydra.run.dir={tmp_path / f'ok{i}'}"])
    run_py(
        [
            *base,
            "engine.launcher=[python,tests/fault_server.py]",
            "+engine.env.FAULT=drop_nccl",
            f"hydra.run.dir={tmp_path / 'lost'}",
        ]
    )
    rec = json.loads((tmp_path / "lost" / "results.json").read_text())
    assert not [k for k in rec["server_env"] if k.startswith("NCCL_")]  # read back from the live process
    assert rec["drift"]["earlier_runs"] == 2
    assert "NCCL_PROTO was LL in the earlier runs, unset now" in rec["drift"]["env_differences"]
    assert any(w.startswith("DRIFT:") for w in rec["warnings"])
    ok = json.loads((tmp_path / "ok1" / "results.json").read_text())
    assert ok["drift"]["env_differences"] == []
    assert ok["server_env"]["NCCL_PROTO"] == "LL"
    # a baseline-only job (drafter=none) is logged like any other: its MLflow run holds the record it wrote
    c = MlflowClient(tmp_store["uri"])
    rec = results.read(tmp_path / "ok1")
    logged = Path(c.download_artifacts(rec.mlflow_run_id, "results.json", str(tmp_path / "dl"))).read_bytes()
    assert logged == (tmp_path / "ok1" / "results.json").read_bytes()
    assert c.get_run(rec.mlflow_run_id).data.metrics["throughput_tok_s"] == pytest.approx(
        rec.metrics["throughput_tok_s"], abs=0.05
    )


# Kimi-K2.5 and its MLA drafter, from config fixtures (published config.json fields, no weights).
FIXTURES = ROOT / "tests" / "data" / "models"
# one point of the experiment's sweep (an experiment that defines a sweep runs only with -m)
KIMI = ["-m", "experiment=kimi_k25_rtx6000x8_eagle3", "spec.steps=3", "nccl=tuned", "dry_run=true", "tracking=off"]


def fixture_copy(tmp_path, name, edit=None, training_ids=None, weights_stub=False):
    """A config fixture in tmp_path; ``weights_stub``: an empty model.safetensors beside it, so that
    preflight takes the path of a checkpoint whose weights are present (nothing is loaded)."""
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    if weights_stub:
        (d / "model.safetensors").touch()
    if edit:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if training_ids is not None:
        (d / "training.json").write_text(json.dumps({"trained_aux_layer_ids": training_ids}))
    return d


def dry_errors(tmp_path, *overrides) -> list[str]:
    """The dry run's errors; a dry run with one exits 2, saying which job and why (a script checking a
    sweep before spending the GPUs reads the status), one without exits 0."""
    p = run_py([*KIMI, *overrides, f"hydra.sweep.dir={tmp_path / 'job'}"], check=False)
    errors = [line for line in p.stdout.splitlines() if line.startswith("# error")]
    assert p.returncode == (2 if errors else 0), p.stderr[-2000:]
    if errors:
        assert "1 job(s) of this dry run would be refused by preflight" in p.stderr, p.stderr[-2000:]
        assert errors[0].removeprefix("# error (would stop this job): ")[:80] in p.stderr
    return errors


def test_kimi_dry_run_passes_preflight_with_the_mla_drafter(tmp_path):
    assert compose_experiment("experiment=kimi_k25_rtx6000x8_eagle3").drafter.name == "kimi_k25_eagle3_mla"
    mla = fixture_copy(tmp_path, "kimi_k25_eagle3_mla", training_ids=[1, 29, 57], weights_stub=True)
    target = fixture_copy(tmp_path, "kimi_k25", weights_stub=True)
    assert dry_errors(tmp_path, f"model.path={target}", f"drafter.path={mla}") == []
    # config.json alone (no weights here): the same checks still run, the missing weights only warn
    assert (
        dry_errors(tmp_path, f"model.path={FIXTURES / 'kimi_k25'}", f"drafter.path={FIXTURES / 'kimi_k25_eagle3_mla'}")
        == []
    )
    wrong = fixture_copy(tmp_path / "w", "kimi_k25_eagle3_mla", edit=lambda c: c.update(architectures=["X"]))
    assert any(
        "architectures is ['X']" in e
        for e in dry_errors(tmp_path, f"drafter.path={wrong}", f"model.path={FIXTURES / 'kimi_k25'}")
    )


def test_kimi_ids_trained_on_1_29_57_served_as_0_29_57_are_refused_naming_the_captured_layers(tmp_path):
    served = fixture_copy(
        tmp_path,
        "kimi_k25_eagle3_mla",
        training_ids=[1, 29, 57],
        edit=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 29, 57]),
    )
    errors = dry_errors(
        tmp_path, f"model.path={FIXTURES / 'kimi_k25'}", f"drafter.path={served}", "drafter.layer_ids=[0,29,57]"
    )
    [trained] = [e for e in errors if "training.json" in e]
    assert (
        "trained on ids [1, 29, 57] -> captured layers [2, 30, 58] (deepseek rule)" in trained
        and "served with ids [0, 29, 57] -> captured layers [0, 29, 57] (deepseek rule)" in trained
    ), errors


def test_kimi_wrong_hidden_size_in_text_config_is_refused(tmp_path):
    target = fixture_copy(tmp_path, "kimi_k25", edit=lambda c: c["text_config"].update(hidden_size=4096))
    errors = dry_errors(tmp_path, f"model.path={target}", f"drafter.path={FIXTURES / 'kimi_k25_eagle3_mla'}")
    assert any("does not fit the target's 4096 (text_config.hidden_size)" in e for e in errors), errors


def test_llama3_pair_with_the_default_capture_passes(tmp_path):
    target = fixture_copy(tmp_path, "llama3_8b_instruct", weights_stub=True)
    eagle3 = fixture_copy(tmp_path, "llama3_8b_eagle3", weights_stub=True, training_ids=[1, 15, 28])
    p = run_py(
        [
            "engine=sglang",
            "hardware=h200x1",
            "dry_run=true",
            "tracking=off",
            "drafter.layer_ids=[1,15,28]",
            "model.num_layers=32",
            f"model.path={target}",
            f"drafter.path={eagle3}",
            f"hydra.run.dir={tmp_path / 'job'}",
        ]
    )
    assert "# error" not in p.stdout, p.stdout


def installed_sglang(tmp_path, version: str) -> dict:
    """The environment of a process in which `sglang` <version> is what importlib.metadata finds: a
    dist-info first on PYTHONPATH (the install, faked at the process boundary; nothing is imported)."""
    site = tmp_path / f"site-{version}"
    (site / f"sglang-{version}.dist-info").mkdir(parents=True)
    (site / f"sglang-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


SGLANG_JOB = ["engine=sglang", "hardware=h200x1", "drafter=none", "tracking=off"]


def test_an_unsupported_sglang_is_refused_naming_it_and_the_supported_ones(tmp_path):
    """The job refuses sglang 0.5.10 before any server (exit 2), naming it, the supported releases and
    the install; a dry run (the laptop preparing a GPU sweep) says the same as a warning."""
    env = installed_sglang(tmp_path, "0.5.10")
    want = "engine=sglang: sglang 0.5.10 is installed; spec-decode-bench supports sglang 0.5.17, 0.5.23 only"
    p = run_py([*SGLANG_JOB, f"hydra.run.dir={tmp_path / 'job'}"], env=env, check=False)
    assert p.returncode == 2, p.stdout[-1000:] + p.stderr[-2000:]
    assert want in p.stderr and "pip install sglang==0.5.17" in p.stderr, p.stderr[-2000:]
    assert not list(tmp_path.glob("job/**/server.log")), "a server was started"
    dry = run_py([*SGLANG_JOB, "dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}"], env=env)
    assert f"# warning: {want}" in dry.stdout, dry.stdout[-2000:]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_a_supported_sglang_passes_the_version_check_without_a_warning(tmp_path, version):
    dry = run_py(
        [*SGLANG_JOB, "dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}"], env=installed_sglang(tmp_path, version)
    )
    assert "sglang 0." not in dry.stdout and "tested against" not in dry.stdout, dry.stdout[-2000:]


def test_sglang_choices_are_never_silent(tmp_path):
    """An inherited SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is named and dropped (the config's choice is passed);
    a dead flag in engine.extra_args is named."""
    p = run_py(
        [
            "engine=sglang",
            "hardware=h200x2",
            "dry_run=true",
            "tracking=off",
            "drafter=none",
            "engine.extra_args=[--num-continuous-decode-steps,4]",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
    )
    assert (
        "# warning: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 in this shell is dropped from the server's environment: "
        "engine.pcie_ipc_allreduce decides"
    ) in p.stdout, p.stdout
    assert "\nSGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0\n" in p.stdout  # the server env the dry run prints
    assert (
        "# warning: engine.extra_args has --num-continuous-decode-steps: parsed by 0.5.23 but read by nothing"
        in p.stdout
    )


FAKE_SMI = """#!/bin/sh
# a fake nvidia-smi at the process boundary: an 8-GPU PCIe box of RTX PRO 6000s
case "$*" in
  -L) for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-$i)"; done ;;
  *query-gpu*) for i in 0 1 2 3 4 5 6 7; do echo "NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.65"; done ;;
  "topo -m") printf '\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tPIX\\t0-15\\nGPU1\\tPIX\\t X \\t0-15\\n' ;;
esac
"""


def test_hardware_labels_are_checked_against_what_the_box_reports(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    p = run_py(
        ["hardware=h200x2", "drafter=none", "dry_run=true", "tracking=off", f"hydra.run.dir={tmp_path / 'j'}"], env=env
    )
    assert (
        "# warning: hardware.gpu_type='NVIDIA H200' but nvidia-smi reports "
        "['NVIDIA RTX PRO 6000 Blackwell Server Edition']"
    ) in p.stdout, p.stdout
    assert "# warning: hardware.interconnect=nvlink but `nvidia-smi topo -m` shows ['pcie'] links" in p.stdout
    p = run_py(
        ["hardware=rtx_pro_6000x8", "drafter=none", "dry_run=true", "tracking=off", f"hydra.run.dir={tmp_path / 'k'}"],
        env=env,
    )
    assert "hardware.gpu_type" not in p.stdout and "hardware.interconnect" not in p.stdout, p.stdout
    # A real job is refused: the profile's name is every record's hardware label (a sweep labelled h200x1
    # once ran on an H100 after one warning line). The interconnect stays a warning.
    p = run_py(
        ["hardware=h200x2", "drafter=none", "tracking=off", f"hydra.run.dir={tmp_path / 'r'}"], env=env, check=False
    )
    said = p.stdout + p.stderr
    assert p.returncode == 2, said
    assert "hardware.gpu_type='NVIDIA H200' but nvidia-smi reports ['NVIDIA RTX PRO 6000" in said, said
    assert "choose this box's hardware profile" in said
    assert "server started" not in said and not list((tmp_path / "r").glob("**/server.log")), said


def test_layer_id_minus_one_is_named_as_the_embedding_output_with_the_trained_ids(tmp_path):
    """Issue 44: [-1, 3, 4] was refused as "EAGLE-3 reads 3 distinct target layers" (three distinct ids)."""
    err = refused(tmp_path, "drafter.layer_ids=[-1,3,4]")
    assert (
        "drafter.layer_ids=[-1, 3, 4]: -1 captures the embedding output (the input of layer 0: the target "
        "captures id + 1, srt/models/llama.py 929-941), not a decoder layer's output; drafter=tiny_eagle3 was "
        "trained on ids [1, 3, 4] -> captured layers [2, 4, 5] (llama rule) (training.json): use "
        "drafter.layer_ids=[1,3,4]"
    ) in err, err
    assert "distinct" not in err and "the checkpoint has" not in err  # one true reason, not another mismatch
    # the checkpoint's own config.json naming -1: the trained-vs-served message says what -1 is
    d = drafter_copy(
        tmp_path, edit_config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[-1, 3, 4])
    )
    err = refused(tmp_path, f"drafter.path={d}", "drafter.layer_ids=null")
    assert "served with ids [-1, 3, 4] (-1: the embedding output) -> captured layers [0, 4, 5]" in err, err
    assert "trained on ids [1, 3, 4]" in err


def test_a_dry_run_that_would_refuse_exits_2_and_says_why_in_its_dir(tmp_path):
    """A dry run answers what the real run would: exit 2 for a job that preflight would stop, its reasons in
    its dir's would_refuse.txt; a sweep in a reused dir counts only its own refusals."""
    one = tmp_path / "one"
    p = run_py(
        ["spec.steps=2", "benchmark.prompts=nope.txt", "dry_run=true", "tracking=off", f"hydra.run.dir={one}"],
        check=False,
    )
    assert p.returncode == 2 and "preflight would stop this job" in p.stderr, p.stderr[-2000:]
    assert (one / "would_refuse.txt").read_text() == "benchmark.prompts=nope.txt: file not found\n"
    sweep = [f"hydra.sweep.dir={tmp_path / 'sweep'}", "dry_run=true", "tracking=off"]
    bad = run_py(["-m", "spec.steps=1,2", "benchmark.prompts=nope.txt", *sweep], check=False)
    assert bad.returncode == 2 and "2 job(s) of this dry run would be refused" in bad.stderr, bad.stderr[-2000:]
    assert len(list((tmp_path / "sweep").glob("*/would_refuse.txt"))) == 2
    ok = run_py(["-m", "spec.steps=1,2", *sweep], check=False)  # the same dir, the cause fixed
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert not list((tmp_path / "sweep").glob("*/would_refuse.txt"))


def test_a_reused_sweep_dir_exits_on_this_sweeps_jobs_alone(tmp_path):
    """A sweep dir run again: an earlier sweep's refused record does not make this one exit 2."""
    sweep = [f"hydra.sweep.dir={tmp_path / 'sweep'}", "dry_run=true", "tracking=off"]
    first = run_py(["-m", "spec.steps=0,2", *sweep], check=False)  # spec.steps=0: a FAILED record (config)
    assert first.returncode == 2 and "1 job(s) refused for bad input" in first.stderr, first.stderr[-2000:]
    again = run_py(["-m", "spec.steps=2", *sweep], check=False)
    assert again.returncode == 0 and "refused" not in again.stderr, again.stderr[-2000:]
