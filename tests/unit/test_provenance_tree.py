"""A record names the files it ran, not only the .git beside them: a device's copy of a checkout keeps the
session's first .git under newer files, so git calls a clean newer commit "dirty" (the eleventh session's
start: records 89c4b27 + changes, files 62f721d). The files' tree hash (``runner.provenance.working_tree``)
rides in the record and metrics.json, and ``starts`` resolves it to the commit it is here. Real git, real
repositories in a temp dir."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from spec_decode.analysis import starts as st
from spec_decode.record.provenance import Provenance
from spec_decode.runner.provenance import git_state, working_tree
from spec_decode.views import metrics_json
from spec_decode.views import starts as starts_view
from spec_decode.views.mlflow_run import tags_of

from .test_reproducibility import cell, steady

pytestmark = pytest.mark.unit

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def lagging(tmp_path) -> tuple[Path, Path, str, str]:
    """A repository with commits A and B (B changes a file and adds one), and a copy of it whose .git is A's
    (taken before B) under B's files: the device's view."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("multirun/\n")
    (repo / "code.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "A")
    a = git(repo, "rev-parse", "HEAD")
    old_git = tmp_path / "old.git"
    shutil.copytree(repo / ".git", old_git)
    (repo / "code.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "B")
    b = git(repo, "rev-parse", "HEAD")
    device = tmp_path / "device"
    shutil.copytree(repo, device, ignore=shutil.ignore_patterns(".git"))
    shutil.copytree(old_git, device / ".git")
    (device / "multirun").mkdir()
    (device / "multirun" / "out.json").write_text("{}")  # what git ignores is no part of the tree
    return repo, device, a, b


def test_the_tree_names_the_files_where_the_git_lags(lagging):
    repo, device, a, b = lagging
    state = git_state(device)
    assert state["commit"] == a and state["dirty"] and state["dirty_paths"] == ["code.py"]  # new.py: untracked
    assert working_tree(device) == git(repo, "rev-parse", f"{b}^{{tree}}")
    assert git(device, "status", "--porcelain", "--untracked-files=no") == "M code.py"  # its index untouched
    assert working_tree(repo) == git(repo, "rev-parse", "HEAD^{tree}")  # a clean checkout: its HEAD's tree
    assert working_tree(device / "multirun") == working_tree(device)  # from a subdirectory: the whole tree


def test_starts_calls_a_lagging_sweep_the_commit_its_files_are(lagging):
    repo, device, a, b = lagging
    trees = starts_view.commit_trees(repo)
    first = {"git_commit": b, "git_dirty": False}
    lag = {"git_commit": a, "git_dirty": True, "git_tree": working_tree(device)}
    notes = st.notes([first, lag], ["S1", "S2"], trees)
    assert notes == [
        f"S2: its files were commit {b[:7]}'s tree (the records say {a[:7]} with changes: the .git it ran with was older than its files)"
    ]
    changed = dict(lag, git_tree="0" * 40)  # files that are no commit's: dirty, and another commit than S1's
    notes = st.notes([first, changed], ["S1", "S2"], trees)
    assert notes[0].startswith(f"S2 was measured at {a[:7]}, S1 at {b[:7]}") and "uncommitted changes" in notes[1]
    assert st.notes([first, dict(lag, git_tree=None)], ["S1", "S2"], trees)[-1].startswith("S2: measured from a tree")
    assert starts_view.commit_trees(repo.parent) == {}  # no git: nothing resolved


def test_the_tree_rides_into_metrics_json_and_mlflow_and_an_older_record_has_none(lagging):
    repo, device, a, b = lagging
    rec = cell(3, steady(400), (1.3, 1.28, 1.32))
    assert "git_tree" not in metrics_json.to_metrics([rec])  # a record from before: metrics.json as it was
    assert "git.tree" not in tags_of(rec)
    rec.provenance = Provenance(git={**git_state(device), "tree": working_tree(device)})
    out = metrics_json.to_metrics([rec])
    tree = git(repo, "rev-parse", f"{b}^{{tree}}")
    assert out["git_commit"] == a and out["git_dirty"] and out["git_tree"] == tree and tags_of(rec)["git.tree"] == tree
