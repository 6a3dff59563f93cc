"""The model builds are deterministic: the same recipe gives bit-identical weights."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.integration
MICRO = ["--steps", "6", "--batch", "2", "--threads", "2"]


def build(*args, cwd, module="spec_decode.engines.embedded.build"):
    p = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-2000:]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_micro_builds_are_bit_identical_and_loadable(tmp_path):
    from spec_decode.engines.embedded.corpus import build_corpus

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(build_corpus(1234, 50_000))
    for run in ("a", "b"):
        build("target", "--corpus", str(corpus), "--out", str(tmp_path / run / "t"), "--hidden", "64",
              "--layers", "4", "--heads", "4", "--ffn", "128", "--max-len", "128", "--seq", "96", *MICRO,
              cwd=tmp_path)
        build("--corpus", str(corpus), "--target", str(tmp_path / run / "t"), "--out", str(tmp_path / run / "data"),
              "--samples", "4", "--heldout", "2", "--seq", "64", "--prompt-tokens", "16", "--threads", "2",
              cwd=tmp_path, module="spec_decode.engines.embedded.drafter_data")
        build("drafter", "--data", str(tmp_path / run / "data"), "--target", str(tmp_path / run / "t"),
              "--out", str(tmp_path / run / "d"), "--layer-ids", "0,1,2", "--mlflow-uri", "off", *MICRO,
              cwd=tmp_path)
    for part in ("t", "d", "data"):
        name = "samples.safetensors" if part == "data" else "model.safetensors"
        assert sha(tmp_path / "a" / part / name) == sha(tmp_path / "b" / part / name)
    # the whole record is the same too (no run id, no wall time): a DVC rebuild leaves git clean
    a, b = (json.loads((tmp_path / run / "d" / "training.json").read_text()) for run in ("a", "b"))
    assert a["data"].pop("path") != b["data"].pop("path")  # the only difference: where each build's data was
    assert a == b
    record = json.loads((tmp_path / "a" / "d" / "training.json").read_text())
    assert record["trained_aux_layer_ids"] == [0, 1, 2]
    cfg = json.loads((tmp_path / "a" / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_corpus_is_stable():
    from spec_decode.engines.embedded.corpus import build_corpus

    text = build_corpus(1234, 2_000_000)
    assert hashlib.sha256(text.encode()).hexdigest().startswith("d0e2fa7e20755f15")
    assert (ROOT / "data" / "corpus.txt").read_text() == text


@pytest.mark.slow
def test_full_dvc_repro_of_the_models_matches_the_committed_hashes(tmp_path):
    """~15 minutes on 2 cores: `dvc repro -f corpus target drafter_data drafter` in a clone, then git sees
    no change (the training's MLflow run goes to the clone's own mlflow.db, which git ignores)."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "PYTHONPATH": str(clone), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    dvc = str(Path(sys.executable).parent / "dvc")
    subprocess.run([dvc, "repro", "-f", "corpus", "target", "drafter_data", "drafter"], cwd=clone, env=env, check=True,
                   capture_output=True, timeout=1800)
    assert subprocess.run(["git", "status", "--porcelain", "models", "data", "dvc.lock"], cwd=clone,
                          capture_output=True, text=True).stdout == ""
