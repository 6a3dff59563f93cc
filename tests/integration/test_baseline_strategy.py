"""One baseline strategy per job (cfg.baseline_strategy, docs/paired-baseline.md), through run.py against
the real embedded engine: the default (paired) starts two servers -- the spec server and its baseline
beside it -- and no baseline job; benchmark.paired=false starts a baseline job instead of the paired
server. Both records carry the same fields."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_py, small

pytestmark = pytest.mark.integration


def servers(rec: dict) -> set[int]:
    """The server processes a record's launches started (the spec server and, paired, its baseline)."""
    return {pid for x in rec["launches"] for pid in (x.get("pid"), x.get("baseline_pid")) if pid is not None}


def test_default_run_starts_two_servers_and_the_job_strategy_the_same_record_fields(tmp_path):
    common = [
        *small(),
        "tracking=off",
        "benchmark.request_pass=true",
        "benchmark.request_max_new_tokens=16",
        "benchmark.ignore_eos=false",
    ]
    run_py([*common, f"hydra.run.dir={tmp_path / 'paired'}"])
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

    run_py([*common, "benchmark.paired=false", f"hydra.run.dir={tmp_path / 'job'}"])
    job = json.loads((tmp_path / "job" / "results.json").read_text())
    base = json.loads((tmp_path / "job" / "baseline" / "results.json").read_text())
    assert len(servers(job)) == 1 and len(servers(base)) == 1  # two servers, one per job
    assert job["speedup_vs_baseline"]["method"] == "welch" and job["baseline_runs"] == []
    assert job["baseline"]["out_dir"] == str(tmp_path / "job" / "baseline")
    assert job["lossless"]["verdict"] == "pass" and job["lossless"]["requests"] == 2 + 12
    assert list(paired) == list(job)  # the same record fields, in the same order
    assert set(paired["metrics"]) == set(job["metrics"])
