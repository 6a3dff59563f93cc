"""A sweep that stopped before every planned job ran (Ctrl-C, a killed job): its recommendation weighed only
the jobs that wrote a record, and the summary says so; with no finished spec job there is nothing to flag."""

from __future__ import annotations

import pytest

from spec_decode.record import results
from spec_decode.views.sweep import PARTIAL, SweepCallback

from .test_small_runs import job

pytestmark = pytest.mark.unit
STEADY = [32 / (300 * (1 + d)) for d in (-0.01, -0.005, 0.0, 0.005, 0.01)]  # five runs at ~300 tok/s


def finalize(sweep, jobs: list[str], recs: dict[str, object]) -> str:
    for d, rec in recs.items():
        results.write(sweep / d, rec)
    cb = SweepCallback()
    cb.sweep_dir, cb.jobs = str(sweep), jobs
    cb._finalize()
    return (sweep / "sweep_summary.txt").read_text()


def test_a_recommendation_from_part_of_a_sweep_says_so(tmp_path):
    text = finalize(tmp_path / "sw", ["spec.steps=1", "spec.steps=3"], {"0_spec.steps=1": job(1, STEADY)})
    assert "  NOT RUN spec.steps=3" in text and "1 of 2 planned job(s) started" in text, text
    assert f"{PARTIAL}: the recommendation above weighs only the 1 job(s) that wrote a record" in text


def test_a_whole_sweep_or_one_without_a_finished_spec_job_is_not_flagged(tmp_path):
    whole = finalize(tmp_path / "a", ["spec.steps=1"], {"0_spec.steps=1": job(1, STEADY)})
    assert PARTIAL not in whole and "planned job(s) started" not in whole
    killed = job(1, STEADY)
    killed.status = "KILLED"
    text = finalize(tmp_path / "b", ["spec.steps=1", "spec.steps=3"], {"0_spec.steps=1": killed})
    assert "NOT RUN spec.steps=3" in text and PARTIAL not in text
