"""Issue 44: a sweep's jobs announce k/N with an ETA from the finished jobs' durations, in plain lines
(every console, not only a terminal). The clock is a time source handed in, so the durations are exact."""

import pytest

from spec_decode.runner.progress import SweepClock, duration, what_varies

pytestmark = pytest.mark.unit


def test_duration_reads_as_a_console_would():
    assert [duration(s) for s in (0.4, 41, 59.6, 246, 3600 + 125)] == ["0 s", "41 s", "1m00s", "4m06s", "1h02m"]


def test_eta_is_the_mean_of_the_finished_jobs_times_the_jobs_left(capsys):
    now = [100.0]
    clock = SweepClock(4, clock=lambda: now[0])
    assert clock.start("spec.steps=1,nccl=tuned") == (
        "sweep: job 1/4 (spec.steps=1,nccl=tuned) starting; ETA after the first job"
    )
    now[0] += 40
    assert clock.end() == "sweep: job 1/4 done in 40 s; 3 to go, ETA 2m00s (mean 40 s per finished job)"
    now[0] += 1
    # this job and the two after it, at 40 s each
    assert clock.start("spec.steps=3,nccl=tuned").endswith("starting; ETA 2m00s (mean 40 s per finished job)")
    now[0] += 60
    assert clock.end() == "sweep: job 2/4 done in 1m00s; 2 to go, ETA 1m40s (mean 50 s per finished job)"
    assert clock.start("").startswith("sweep: job 3/4 (defaults) starting; ETA 1m40s")
    now[0] += 20  # mean (40 + 60 + 20) / 3 = 40 s, one job left
    assert clock.end().endswith("1 to go, ETA 40 s (mean 40 s per finished job)")
    clock.start("spec.steps=5,nccl=default")
    now[0] += 40
    assert clock.end() == "sweep: job 4/4 done in 40 s; all 4 in 2m41s"
    err = capsys.readouterr().err.splitlines()  # each line also went to the console
    assert len(err) == 8 and err[0].startswith("sweep: job 1/4") and err[-1].endswith("all 4 in 2m41s")


def test_a_job_is_named_by_what_varies():
    jobs = [
        "spec.steps=1,nccl=tuned,benchmark.runs=2,engine.extra_args=[a,b]",
        "spec.steps=3,nccl=tuned,benchmark.runs=2,engine.extra_args=[a,b]",
    ]
    assert what_varies(jobs) == ["spec.steps=1", "spec.steps=3"]
    assert what_varies(["spec.steps=1,nccl=tuned", "spec.steps=1,nccl=default"]) == ["nccl=tuned", "nccl=default"]
    assert what_varies([""]) == [""]  # one job at the defaults: "defaults" on the console
