"""The request pass, prompt categories and the lossless guard through run.py against the real embedded
engine (a baseline job, real MLflow store); a non-lossless engine (fault at the process
boundary) fails the check with the position."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.runner.client import output_sha256

from ..conftest import run_py, small

pytestmark = pytest.mark.integration
CATEGORIES = {"narrative", "qa", "summarization", "translation", "math", "code"}


def test_request_pass_categories_and_lossless_pass(request_pass_job):
    # the shared job (tests/integration/conftest.py: REQUEST_PASS_JOB, benchmark.paired=false, its own
    # store): a baseline job with its own record; test_baseline_strategy reads it too
    out = request_pass_job.dir
    spec = json.loads((out / "results.json").read_text())
    base = json.loads((out / "baseline" / "results.json").read_text())
    for rec, d in ((spec, out), (base, out / "baseline")):
        assert [e["prompt_index"] for e in rec["requests"]] == list(range(12))
        assert {e["category"] for e in rec["requests"]} == set(rec["categories"]) == CATEGORIES
        # ignore_eos=false: the tiny byte-level model has no EOS, so every request runs to its limit
        # (the speculative last cycle may commit up to `steps` tokens more)
        assert all(24 <= e["completion_tokens"] <= 27 for e in rec["requests"])
        lines = [json.loads(x) for x in (d / "outputs.jsonl").read_text().splitlines()]
        assert [x["output_sha256"] for x in lines] == [e["output_sha256"] for e in rec["requests"]]
        assert all(output_sha256(x["output_ids"]) == x["output_sha256"] for x in lines)
    assert all(e["completion_tokens"] == 24 and e["accept_len"] is None for e in base["requests"])
    for name, c in spec["categories"].items():
        es = [e for e in spec["requests"] if e["category"] == name]
        assert c["n"] == len(es) == 2
        assert c["accept_len"] == pytest.approx(
            sum(e["completion_tokens"] for e in es) / sum(e["verify_ct"] for e in es)
        )
        assert c["accept_len"] > 1
        assert sum(es[0]["histogram"]) == es[0]["verify_ct"]  # the engine's per-request histogram
    # the request pass runs after the profiled pass's windows: the profile holds exactly their cycles
    assert spec["profile"]["complete"] and spec["profile"]["cycles"] == sum(
        r["spec_verify_ct"] for r in spec["profiled_runs"]
    )
    g = spec["lossless"]
    assert g["verdict"] == "pass" and g["requests"] == 2 + 12 and g["first_divergence"] == {}
    assert {c["name"]: c["ok"] for c in spec["checks"]}["lossless_vs_baseline"] is True
    run = MlflowClient(request_pass_job.uri).get_run(spec["mlflow_run_id"])
    assert run.data.metrics["lossless_match_rate"] == 1.0
    assert run.data.metrics["category_code_accept_len"] == pytest.approx(
        spec["categories"]["code"]["accept_len"], abs=1e-4
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_speculative_engine_that_changes_token_17_fails_the_check(tmp_path, stream):
    out = tmp_path / "job"
    run_py(
        [
            *small("benchmark.profile=false"),  # the guard compares the timed runs' outputs
            f"benchmark.stream={str(stream).lower()}",
            "tracking=off",
            f"hydra.run.dir={out}",
            "engine.launcher=[python,tests/fault_server.py]",
            "+engine.env.FAULT=corrupt_output:17",
            "+engine.env.FAULT_IF_ARG=--speculative-algorithm:EAGLE3",
        ],
        check=False,
    )
    spec = json.loads((out / "results.json").read_text())
    if stream and spec["status"] == "FAILED" and "stream" in (spec["error"] or ""):
        pytest.skip(f"the embedded server answers a stream request without SSE: {spec['error'][:200]}")
    assert spec["status"] == "FINISHED", spec["error"]
    g = spec["lossless"]
    assert g["verdict"] == "fail" and g["first_divergence"] == {"timed:0": 17} and g["matched"] == 0
    assert {c["name"]: c["ok"] for c in spec["checks"]}["lossless_vs_baseline"] is False
    assert spec["metrics"]["lossless_match_rate"] == 0.0
