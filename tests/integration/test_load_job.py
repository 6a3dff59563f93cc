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
    run_py(["benchmark.concurrency=2", "benchmark.load_requests=4", "benchmark.profile=false", "tracking=off",
            f"hydra.run.dir={tmp_path}", *small("benchmark.max_new_tokens=24")])
    rec = results.read(tmp_path)
    assert rec.status == "FINISHED" and not (tmp_path / "baseline").exists()
    assert rec.config["benchmark"]["concurrency"] == 2
    assert rec.speedup_vs_baseline["method"] == "paired" and rec.metrics["speedup_vs_baseline"] > 0
    arms = [x["arm"] for x in rec.launches[0]["load_runs"]]
    assert arms.count(load.SELF) == arms.count(load.PAIRED) == 2  # both arms of each pair under the same load
    assert rec.metrics["concurrency"] == 2 and rec.metrics["running_req_max"] == 2
    # the aggregate tok/s of each run is what the protocol's throughput and speedup read
    mine = [x["aggregate_tok_s"] for x in rec.launches[0]["load_runs"] if x["arm"] == load.SELF]
    assert [r.throughput_tok_s for r in rec.runs] == pytest.approx(mine)
    assert rec.lossless["verdict"] == "pass" and rec.lossless["requests"] == 2 * 4
    assert "lossless_vs_baseline" in [c.name for c in rec.checks if c.ok]
    assert rec.extra["load"]["batch_invariance"]["equal"] == 8
