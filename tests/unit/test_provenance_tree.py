"""A record names the files it ran, not only the .git beside them: a device's copy of a checkout keeps the
session's first .git under newer files, so git calls a clean newer commit "dirty" (the eleventh session's
start: records 89c4b27 + changes, files 62f721d). The files' tree hash and their untracked entries
(``runner.provenance.working_files``) ride in the record and metrics.json, and ``starts`` resolves them to
the commit they are here (``views.starts.resolve``). Real git, real repositories in a temp dir."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from spec_decode.analysis import starts as st
from spec_decode.record.provenance import Provenance
from spec_decode.runner import provenance
from spec_decode.runner.provenance import git_state, working_files
from spec_decode.views import metrics_json
from spec_decode.views import starts as starts_view
from spec_decode.views.mlflow_run import tags_of

from .test_reproducibility import cell, steady

pytestmark = pytest.mark.unit

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def lagging(tmp_path, monkeypatch) -> tuple[Path, Path, str, str]:
    """A repository with commits A and B (B changes a file and adds one), and a copy of it whose .git is A's
    (taken before B) under B's files: the device's view."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # tmp_path's parents are no repository
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


def test_the_tree_names_the_files_where_the_git_lags_and_writes_nothing_to_it(lagging):
    repo, device, a, b = lagging
    state = git_state(device)
    assert state["commit"] == a and state["dirty"] and state["dirty_paths"] == ["code.py"]  # new.py: untracked
    objects = git(device, "count-objects", "-v")
    got = working_files(device)
    assert got["tree"] == git(repo, "rev-parse", f"{b}^{{tree}}")
    assert got["untracked"] == [["100644", git(repo, "rev-parse", f"{b}:new.py"), "new.py"]]
    assert git(device, "count-objects", "-v") == objects  # no object written into its .git
    assert git(device, "status", "--porcelain", "--untracked-files=no") == "M code.py"  # its index untouched
    assert working_files(repo) == {"tree": git(repo, "rev-parse", "HEAD^{tree}"), "untracked": []}
    assert working_files(device / "multirun") == got  # from a subdirectory: the whole tree
    assert working_files(device.parent) is None  # no repository


def test_too_many_untracked_bytes_give_no_tree_rather_than_a_stalled_job(lagging, monkeypatch):
    repo, device, a, b = lagging
    monkeypatch.setattr(provenance, "UNTRACKED_CAP", (50, 5))  # new.py is 6 bytes
    assert working_files(device) is None
    monkeypatch.setattr(provenance, "UNTRACKED_CAP", (0, 1 << 20))
    assert working_files(device) is None and working_files(repo) is not None


def test_starts_calls_a_lagging_sweep_the_commit_its_files_are(lagging):
    repo, device, a, b = lagging
    first = {"git_commit": b, "git_dirty": False}
    got = working_files(device)
    lag = {"git_commit": a, "git_dirty": True, "git_tree": got["tree"], "git_untracked": got["untracked"]}
    resolved = starts_view.resolve([first, lag], repo)
    assert resolved == [None, (b, [])]
    assert st.notes([first, lag], ["S1", "S2"], resolved) == [
        f"S2: its files were commit {b[:7]}'s (the records say {a[:7]} with uncommitted changes; the tree of its "
        "files names the commit)"
    ]
    changed = dict(lag, git_tree="0" * 40)  # files that are no commit's: dirty, and another commit than S1's
    notes = st.notes([first, changed], ["S1", "S2"], starts_view.resolve([first, changed], repo))
    assert notes[0].startswith(f"S2 was measured at {a[:7]}, S1 at {b[:7]}") and "uncommitted changes" in notes[1]
    assert starts_view.resolve([first, dict(lag, git_tree=None)], repo) == [None, None]
    assert starts_view.resolve([first, lag], repo.parent) == [None, None]  # no git here: nothing resolved


def test_an_untracked_file_beside_a_commits_files_is_named_and_a_stash_is_no_commit(lagging):
    """The session's notes, written but not committed, beside the commit's files: the commit, plus the file.
    A stash holding exactly the files is not what ran: no branch has it."""
    repo, device, a, b = lagging
    (device / "notes.md").write_text("a session's notes\n")
    got = working_files(device)
    assert got["tree"] != git(repo, "rev-parse", f"{b}^{{tree}}")
    lag = {"git_commit": a, "git_dirty": True, "git_tree": got["tree"], "git_untracked": got["untracked"]}
    assert starts_view.resolve([lag], repo) == [(b, ["notes.md"])]
    (note,) = st.notes([lag], ["S1"], starts_view.resolve([lag], repo))
    assert note.endswith("plus 1 untracked file(s) no commit holds: notes.md")
    (repo / "code.py").write_text("x = 3\n")  # an edit never committed, then stashed: the stash's tree is it
    edited = working_files(repo)
    git(repo, "stash", "-q")
    assert git(repo, "rev-parse", "stash@{0}^{tree}") == edited["tree"] != working_files(repo)["tree"]
    stashed = {"git_commit": b, "git_dirty": True, "git_tree": edited["tree"], "git_untracked": []}
    assert starts_view.resolve([stashed], repo) == [None]


def test_the_tree_rides_into_metrics_json_and_mlflow_and_an_older_record_has_none(lagging):
    repo, device, a, b = lagging
    rec = cell(3, steady(400), (1.3, 1.28, 1.32))
    assert "git_tree" not in metrics_json.to_metrics([rec])  # a record from before: metrics.json as it was
    assert "git.tree" not in tags_of(rec)
    rec.provenance = Provenance(git={**git_state(device), **working_files(device)})
    out = metrics_json.to_metrics([rec])
    tree = git(repo, "rev-parse", f"{b}^{{tree}}")
    assert out["git_commit"] == a and out["git_dirty"] and out["git_tree"] == tree and tags_of(rec)["git.tree"] == tree
    assert out["git_untracked"] == [["100644", git(repo, "rev-parse", f"{b}:new.py"), "new.py"]]
