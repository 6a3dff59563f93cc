"""Issue 29 (f): progress on a terminal (a real pseudo-terminal): per job the phase, run k/N and tok/s
so far; per sweep job i/N, elapsed and ETA. Nothing of it when the output is a pipe. Issue 44: on every
console (a pipe too) each sweep job announces k/N, and an ETA from the finished jobs' durations."""

import fcntl
import os
import pty
import re
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


def _seconds(text: str) -> int:
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+) ?s)?", text)
    h, mi, s = (int(x or 0) for x in m.groups())
    return 3600 * h + 60 * mi + s


def test_a_sweep_not_on_a_terminal_announces_each_job_k_of_n_with_an_eta(headline_sweep):
    # the shared sweep (tests/integration/conftest.py: spec.steps=1,3 x nccl=tuned,default), stderr a pipe:
    # no bar, but each job says k/N when it starts and ends, the ETA from the finished jobs' durations
    err = headline_sweep.proc.stderr
    starts = re.findall(r"^sweep: job (\d)/4 \((\S+)\) starting; (.*)$", err, re.M)
    ends = re.findall(r"^sweep: job (\d)/4 done in (\S+ ?s); (.*)$", err, re.M)
    assert [int(k) for k, _, _ in starts] == [1, 2, 3, 4] == [int(k) for k, _, _ in ends], err[-3000:]
    assert starts[0][1] == "spec.steps=1,nccl=tuned" and starts[0][2] == "ETA after the first job"
    done = [_seconds(d) for _, d, _ in ends]
    assert all(d > 0 for d in done), done
    for k in (2, 3, 4):  # ETA at job k = mean of the k-1 finished jobs x the 5-k jobs from this one on
        eta = _seconds(re.match(r"ETA (.+?) \(mean", starts[k - 1][2]).group(1))
        assert abs(eta - sum(done[: k - 1]) / (k - 1) * (5 - k)) <= 2 * (5 - k), (k, eta, done)
    assert ends[-1][2].startswith("all 4 in ")
