"""One baseline strategy per job (cfg.baseline_strategy, docs/paired-baseline.md), through run.py against
the real embedded engine: the default (paired) starts two servers -- the spec server and its baseline
beside it -- and no baseline job; benchmark.paired=false starts a baseline job instead of the paired
server. Both records carry the same fields."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_py
from .conftest import REQUEST_PASS_JOB

pytestmark = pytest.mark.integration


def servers(rec: dict) -> set[int]:
    """The server processes a record's launches started (the spec server and, paired, its baseline)."""
    return {pid for x in rec["launches"] for pid in (x.get("pid"), x.get("baseline_pid")) if pid is not None}


def test_default_run_starts_two_servers_and_the_job_strategy_the_same_record_fields(tmp_path, request_pass_job):
    # the paired run: the shared request-pass job's config (tests/integration/conftest.py: REQUEST_PASS_JOB),
    # the default strategy, tracking off
    run_py([*REQUEST_PASS_JOB, "tracking=off", f"hydra.run.dir={tmp_path / 'paired'}"])
    paired = json.loads((tmp_path / "paired" / "results.json").read_text())
    assert not (tmp_path / "paired" / "baseline").exists()  # no baseline job
    assert len(servers(paired)) == 2 and len(paired["launches"]) == 1
    sp = paired["speedup_vs_baseline"]
    assert sp["method"] == "paired" and sp["pairs"] == 2 and "vs_baseline_job" not in sp
    assert len(paired["baseline_runs"]) == 2 and paired["baseline"]["out_dir"] is None
    # the profiled pass's cycles carry the requests' meta_info id (one rid from the front to the ranks)
    assert paired["profile"].get("complete") is True, paired["profile"]
    # the request pass ran on the paired server too: the guard compared all 12 requests with its outputs
    g = paired["lossless"]
    assert g["verdict"] == "pass" and g["requests"] == 2 + 12, g
    assert (tmp_path / "paired" / "baseline.outputs.jsonl").is_file()

    # the job strategy (benchmark.paired=false) on the same config: the shared job, read only
    d = request_pass_job.dir
    job = json.loads((d / "results.json").read_text())
    base = json.loads((d / "baseline" / "results.json").read_text())
    assert len(servers(job)) == 1 and len(servers(base)) == 1  # two servers, one per job
    assert job["speedup_vs_baseline"]["method"] == "welch" and job["baseline_runs"] == []
    assert job["baseline"]["out_dir"] == str(d / "baseline")
    assert job["lossless"]["verdict"] == "pass" and job["lossless"]["requests"] == 2 + 12
    assert list(paired) == list(job)  # the same record fields, in the same order
    assert set(paired["metrics"]) == set(job["metrics"])
