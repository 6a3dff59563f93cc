"""Stopping a server the way SGLang stops itself (spec_decode.engines.server_process.shutdown): SIGTERM to the
launcher only, its drain waited for, SIGKILL to the group only after the grace period, and no process
of it left afterwards. The launcher is a fake process (tests/fake_launcher.py): the double sits at the
process boundary, everything on our side is the runner's real code."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from spec_decode.engines.server_process import shutdown

from ..conftest import ROOT

pytestmark = pytest.mark.integration


def launch(out, mode: str) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/fake_launcher.py"), str(out), mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    word, child = p.stdout.readline().split()
    assert word == "READY"
    return p, int(child)


def gone(*pids: int) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_launcher_that_needs_10_s_to_drain_loses_nothing(tmp_path):
    out = tmp_path / "drain.txt"
    p, child = launch(out, "10")
    t0 = time.monotonic()
    info = shutdown(p.pid, grace_s=25.0, reap=p.poll)
    took = time.monotonic() - t0
    assert info["drained"] and info["killed"] == [] and info["gone"], info
    assert 10.0 <= took < 20.0, took
    assert out.read_text().splitlines() == [f"drained {i} s" for i in range(1, 11)] + [
        "rank tail written",
        "launcher done",
    ]
    assert p.wait(timeout=5) == 0 and gone(p.pid, child)


def test_a_launcher_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    p, child = launch(tmp_path / "ignore.txt", "ignore")
    t0 = time.monotonic()
    info = shutdown(p.pid, grace_s=2.0, reap=p.poll)
    took = time.monotonic() - t0
    assert not info["drained"] and set(info["killed"]) >= {p.pid, child} and info["gone"], info
    assert 2.0 <= took < 8.0, took
    assert p.wait(timeout=5) == -9 and gone(p.pid, child)
    assert not (tmp_path / "ignore.txt").exists()  # nothing was asked of it but to die


def test_only_the_launcher_gets_sigterm(tmp_path):
    """The child ("rank") hears of the shutdown from its launcher, never from us: SGLang's watchdog
    reads a child's own SIGTERM death as a crash and SIGKILLs the rest."""
    out = tmp_path / "order.txt"
    p, child = launch(out, "1")
    info = shutdown(p.pid, grace_s=10.0, reap=p.poll)
    assert info["drained"], info
    # The rank's tail comes after the launcher's drain: it was told by the launcher, at the end.
    assert out.read_text().splitlines() == ["drained 1 s", "rank tail written", "launcher done"]


def test_children_a_dead_launcher_left_behind_get_sigterm_and_drain(tmp_path):
    """The embedded engine's front dies at once on SIGTERM: its ranks, left behind, are told (SIGTERM)
    and drain within the grace -- never only SIGKILLed at its end (their profile tails were lost)."""
    out = tmp_path / "orphan.txt"
    p, child = launch(out, "die")
    t0 = time.monotonic()
    info = shutdown(p.pid, grace_s=10.0, reap=p.poll)
    assert info["drained"] and info["killed"] == [] and time.monotonic() - t0 < 5.0, info
    assert out.read_text().splitlines() == ["rank tail written"] and gone(p.pid, child)


def test_children_of_a_launcher_already_dead_and_reaped_get_sigterm_at_once(tmp_path):
    """A server that died mid-run (a fault, an OOM kill) and whose launcher the runner already reaped: its
    tree is gone from the process table, its group is not. The rest of the group is told at once and
    drains -- not left the whole grace period without a word, then SIGKILLed (a test saw 30 s of it)."""
    out = tmp_path / "reaped.txt"
    p, child = launch(out, "die")
    p.kill()
    p.wait(timeout=5)  # reaped: psutil no longer knows the launcher's pid
    t0 = time.monotonic()
    info = shutdown(p.pid, grace_s=10.0, reap=p.poll)
    assert info["drained"] and info["killed"] == [] and time.monotonic() - t0 < 5.0, info
    assert out.read_text().splitlines() == ["rank tail written"] and gone(child)
