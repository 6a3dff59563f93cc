"""A job under load through run.py (issue 28): speedup at its own concurrency, outputs equal to bs 1."""

from __future__ import annotations

import pytest

from spec_decode.record import results
from spec_decode.runner import load

from ..conftest import run_py, small

pytestmark = pytest.mark.integration


def test_a_job_under_load_has_its_speedup_at_its_own_concurrency(tmp_path):
    """run.py with benchmark.concurrency=2: the paired baseline (the default strategy: no baseline job) ran
    the same load, and every request under load equals the baseline's bs-1 output."""
    run_py(
        [
            "benchmark.concurrency=2",
            "benchmark.load_requests=4",
            "benchmark.profile=false",
            "tracking=off",
            f"hydra.run.dir={tmp_path}",
            *small("benchmark.max_new_tokens=24"),
        ]
    )
    rec = results.read(tmp_path)
    assert rec.status == "FINISHED" and not (tmp_path / "baseline").exists()
    assert rec.config["benchmark"]["concurrency"] == 2
    assert rec.speedup_vs_baseline.method == "paired" and rec.metrics["speedup_vs_baseline"] > 0
    arms = [x.arm for x in rec.launches[0].load_runs]
    assert arms.count(load.SELF) == arms.count(load.PAIRED) == 2  # both arms of each pair under the same load
    assert rec.metrics["concurrency"] == 2 and rec.metrics["running_req_max"] == 2
    # the aggregate tok/s of each run is what the protocol's throughput and speedup read
    mine = [x.aggregate_tok_s for x in rec.launches[0].load_runs if x.arm == load.SELF]
    assert [r.throughput_tok_s for r in rec.runs] == pytest.approx(mine)
    assert rec.lossless.verdict == "pass" and rec.lossless.requests == 2 * 4
    assert "lossless_vs_baseline" in [c.name for c in rec.checks if c.ok]
    assert rec.load.batch_invariance.equal == 8


def test_the_profiled_pass_under_load_profiles_the_batches_the_timed_runs_ran(tmp_path):
    """Issue 27 against the overlap mode at concurrency > 1: the profiled pass runs the job's load (not one
    request alone), each profiled request is a window of the profile, the batched cycles count once per
    request they served (cycles == the requests' spec_verify_ct), the in-flight extras are set apart,
    and the checks pass."""
    run_py(
        [
            "benchmark.concurrency=4",
            "benchmark.load_requests=8",
            "benchmark.profile=true",
            "benchmark.profile_pairs=2",
            "benchmark.baseline_arm=false",
            "tracking=off",
            f"hydra.run.dir={tmp_path}",
            *small("benchmark.max_new_tokens=32"),
        ]
    )
    rec = results.read(tmp_path)
    assert rec.status == "FINISHED", rec.error
    assert len(rec.profiled_runs) == 2 and len(rec.profiled_requests) == 2 * 8
    assert all(r.rid for r in rec.profiled_requests)
    assert len({r.rid for r in rec.profiled_requests}) == 16
    # the timed runs' load figures hold the timed runs only
    assert len([x for x in rec.launches[0].load_runs if x.arm == load.SELF]) == 2
    prof = rec.profile
    assert prof.batch_size_mean > 1.5, prof.batch_size_mean  # batches, as in the timed runs
    assert prof.complete and prof.cycles == sum(r.spec_verify_ct for r in rec.profiled_requests)
    assert prof.extra_cycles >= 1  # the overlap loop's in-flight cycles, reported apart
    assert rec.profile_pass.pairs == 2 and len(rec.profile_pass.dormant_tok_s) == 2
    failed = [c for c in rec.checks if c.ok is False]
    assert not failed, failed
    assert results.read(tmp_path).profiled_requests[0].rid == rec.profiled_requests[0].rid  # survives a re-read
