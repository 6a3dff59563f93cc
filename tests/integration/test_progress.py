"""Issue 29 (f): progress on a terminal (a real pseudo-terminal): per job the phase, run k/N and tok/s
so far; per sweep job i/N, elapsed and ETA. Nothing of it when the output is a pipe."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from ..conftest import ROOT, own_slots, small

pytestmark = pytest.mark.integration


def run_on_terminal(args: list[str]) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # a terminal's size (tqdm's width)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *own_slots(args)],
        cwd=ROOT,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=600)
    os.close(master)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def test_sweep_on_a_terminal_shows_phases_runs_tok_s_and_eta(tmp_path):
    out = run_on_terminal(
        [
            "-m",
            "spec.steps=1,2",
            "benchmark.baseline_arm=false",
            *small("benchmark.runs=3", "benchmark.profile=false"),  # the phases asserted come before it
            "tracking=off",
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    assert "starting server (loading weights)" in out
    assert "warmup" in out and "run 3/3" in out
    assert "tok/s so far" in out
    assert "sweep: job 1/2 done, elapsed" in out and "ETA" in out
    assert "running job 2/2" in out


def test_no_progress_when_not_a_terminal(single_job):
    # the shared single job (tests/integration/conftest.py): run.py's stderr was a pipe, not a terminal
    p = single_job.proc
    assert "tok/s so far" not in p.stderr and "\r" not in p.stderr
