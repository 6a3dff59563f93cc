"""Issue 29 (d): the advice for missing weights and a missing sglang works when followed. A git-tracked
drafter (a fresh clone of this repo) says `git checkout -- <path>`; DVC-tracked weights (a real DVC repo
with a local remote) say `dvc pull <path>`; each command is run as printed and preflight then passes."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from spec_decode.runner import doctor, preflight, preflight_items

from ..conftest import DRAFTER, PROMPTS, ROOT, TARGET, compose_experiment

pytestmark = pytest.mark.integration


def sh(cmd: str, cwd: Path) -> None:
    # this interpreter's bin first: dvc is the one installed beside it (an unactivated venv works too)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    subprocess.run(
        cmd, shell=True, cwd=cwd, check=True, capture_output=True, timeout=300, env={**os.environ, "PATH": path}
    )


def advice(cfg, root: Path) -> str:
    found = [e for e in preflight.check(cfg, root).errors if "drafter.path=" in e and "weights not found" in e]
    assert found, "no missing-weights error"
    return re.search(r"run `([^`]+)`", found[0]).group(1)


def weights_ok(cfg, root: Path) -> bool:
    return not [e for e in preflight.check(cfg, root).errors if "weights not found" in e]


def test_git_tracked_drafter_says_git_checkout_and_that_restores_it(tmp_path):
    clone = tmp_path / "clone"
    sh(f"git clone -q {ROOT} {clone}", tmp_path)
    shutil.rmtree(clone / "models/tiny/drafter")
    cfg = compose_experiment(f"benchmark.prompts={PROMPTS}", f"model.path={TARGET}")
    cmd = advice(cfg, clone)
    assert cmd == "git checkout -- models/tiny/drafter"
    sh(cmd, clone)
    assert weights_ok(cfg, clone)


def test_dvc_tracked_weights_say_dvc_pull_and_that_restores_them(tmp_path):
    repo, remote = tmp_path / "repo", tmp_path / "remote"
    repo.mkdir()
    shutil.copytree(DRAFTER, repo / "weights/drafter")
    sh(
        "git init -q && dvc init -q && dvc remote add -d local "
        + str(remote)
        + " && dvc add -q weights/drafter && dvc push -q && git add -A && git commit -qm w",
        repo,
    )
    shutil.rmtree(repo / "weights/drafter")
    sh("rm -rf .dvc/cache", repo)  # as on another machine: only the remote has them
    cfg = compose_experiment(f"benchmark.prompts={PROMPTS}", f"model.path={TARGET}", "drafter.path=weights/drafter")
    cmd = advice(cfg, repo)
    assert cmd == "dvc pull weights/drafter"
    sh(f"{Path(sys.executable).parent}/{cmd}", repo)
    assert weights_ok(cfg, repo)


def test_a_sweep_asks_dvc_once_and_again_when_the_pipeline_changes(tmp_path):
    """A sweep's jobs share one process: the answer "does DVC track this path" is kept for the same
    dvc.yaml and dvc.lock (opening the repo costs ~0.6 s of CPU per job), and asked again when they change."""
    repo = tmp_path / "repo"
    repo.mkdir()
    sh("git init -q && dvc init -q", repo)
    stage = "stages:\n  make:\n    cmd: echo\n    outs:\n      - weights/a\n"
    (repo / "dvc.yaml").write_text(stage)
    untracked = "this repo has no DVC pointer for it yet"
    assert untracked not in preflight_items.missing_weights(repo, "weights/a", "drafter.path")
    assert untracked in preflight_items.missing_weights(repo, "weights/b", "drafter.path")
    assert untracked in preflight_items.missing_weights(repo, "weights/b", "drafter.path")  # kept: same answer
    (repo / "dvc.yaml").write_text(stage + "      - weights/b\n")  # now a stage makes it
    assert untracked not in preflight_items.missing_weights(repo, "weights/b", "drafter.path")


def test_doctor_says_sglang_is_absent_not_moved_and_the_extra_it_names_exists():
    if doctor.importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here: the absent case cannot be shown")
    items = {it.name: it for it in doctor.static_checks("sglang")}
    assert items["hook targets"].detail == "sglang is not installed (pip install -e '.[sglang]')"
    assert "moved" not in items["hook targets"].fix
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["sglang"] == ["sglang==0.5.23"]  # what `pip install -e '.[sglang]'` installs


def test_doctor_reports_a_server_that_cannot_start_as_a_fail_line_not_a_traceback():
    """The doctor's live part on a server that dies at start-up (the fault wrapper): one [FAIL] line with
    the server log's last lines and what to do, exit 1, no traceback."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.runner.doctor",
            "engine.launcher=[python,tests/fault_server.py]",
            "+engine.env.FAULT=start_crash",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert re.search(r"\[FAIL\] live request: not run: server exited with code 3 during start-up", p.stdout), p.stdout
    assert "what to do: fix what the server log says" in p.stdout
