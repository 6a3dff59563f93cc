"""Per-position acceptance from real processes: the profile a real embedded server writes gives the same
histogram as its own meta_info counters, request by request; a real sweep (the shared headline sweep:
run.py, MLflow in tmp) records the histogram and rates in results.json, logs the charts on each child run and the step
recommendation on the parent."""

import json
import time

import pytest
import requests
from mlflow.tracking import MlflowClient

from spec_decode.analysis import acceptance
from spec_decode.parsers.profile import summarize_run_windows
from spec_decode.record import results
from spec_decode.runner.client import RunRecord

from ..conftest import PROMPTS
from .engine_args import embedded_server, spec_flags

pytestmark = pytest.mark.integration
STEPS = 5  # deep enough that positions 4-5 (past the drafter's 3 training steps) are measured


def test_profile_histogram_equals_the_servers_counters_per_request(tmp_path):
    prompts = [json.loads(line)["text"] for line in PROMPTS.read_text().splitlines()[:3]]
    runs, metas = [], []
    with embedded_server(
        tmp_path / "server.log",
        *spec_flags(STEPS),
        env={"SPEC_DECODE_PROFILE": str(tmp_path / "profile.jsonl")},
        startup_timeout_s=60,
    ) as srv:
        for i, text in enumerate(prompts):
            t0 = time.time()
            out = requests.post(
                srv.base_url + "/generate",
                timeout=60,
                json={"text": text, "sampling_params": {"max_new_tokens": 96, "temperature": 0, "ignore_eos": True}},
            ).json()
            meta = out["meta_info"]
            metas.append(meta)
            runs.append(
                RunRecord(
                    launch=0,
                    run=i,
                    start_wall=t0,
                    end_wall=time.time(),
                    wall_s=time.time() - t0,
                    prompt_tokens=meta["prompt_tokens"],
                    completion_tokens=meta["completion_tokens"],
                    spec_verify_ct=meta["spec_verify_ct"],
                    rid=meta["id"],
                )
            )
        # No wait for the flusher: the runner reads the profile after it stops the server, so the stop
        # must write the tail (a stop under load lost the last request's cycles: CI 2026-12-04, the
        # exit's flush deadlocked by the parent-death SIGTERM; tests/unit/test_profiler.py).
    # as the record does: each window's cycles that its request counted (the overlap scheduler's
    # in-flight extra cycle after a finished request is set apart, as SGLang's counters skip it)
    _, per_run = summarize_run_windows(
        tmp_path / "profile.jsonl",
        [(r.start_wall, r.end_wall) for r in runs],
        requests=[(r.rid, r.spec_verify_ct) for r in runs],
    )
    acc = acceptance.summarize(STEPS, runs, per_run)
    assert acc.source == "profile"
    # request by request, the profiler's cycles and the server's own counters tell the same story
    for entry, meta in zip(acc.per_request, metas):
        assert entry["histogram"] == meta["spec_correct_drafts_histogram"]
        assert sum(entry["histogram"]) == meta["spec_verify_ct"]
        assert sum(a * n for a, n in enumerate(entry["histogram"])) == meta["spec_num_correct_drafts"]
    total = [sum(m["spec_correct_drafts_histogram"][a] for m in metas) for a in range(STEPS + 1)]
    assert acc.histogram == total
    reach = [sum(total[i:]) for i in range(STEPS + 1)]
    assert acc.per_position == [reach[i] / reach[i - 1] for i in range(1, STEPS + 1)]
    lengths = [m["completion_tokens"] / m["spec_verify_ct"] for m in metas]
    assert acc.accept_len_unweighted == pytest.approx(sum(lengths) / 3)
    want = sum(m["spec_verify_ct"] for m in metas)
    assert acc.accept_len_weighted == pytest.approx(sum(m["completion_tokens"] for m in metas) / want)
    assert len(set(lengths)) > 1  # three prompts, three lengths: the two means differ
    assert acc.accept_len_unweighted != pytest.approx(acc.accept_len_weighted, abs=1e-9)


def test_sweep_records_and_logs_acceptance_and_the_recommendation(tmp_path, headline_sweep):
    # the shared sweep (tests/integration/conftest.py): spec.steps=1,3 x nccl=tuned,default, small jobs
    sweep = headline_sweep.dir
    recs = results.collect(sweep)
    assert sorted(r.steps for r in recs) == [1, 1, 3, 3]
    for rec in recs:
        k = rec.steps
        acc = rec.acceptance
        assert acc.source == "profile" and len(acc.histogram) == k + 1
        runs = rec.profiled_runs  # the profile's histogram is of the profiled pass (issue 27)
        assert runs and sum(acc.histogram) == sum(r.spec_verify_ct for r in runs)
        # the histogram's committed tokens vs the counters: the prefill made each run's first token, the
        # last cycle may commit up to k past max_new_tokens
        committed = sum((a + 1) * n for a, n in enumerate(acc.histogram))
        completion = sum(r.completion_tokens for r in runs)
        n = len(runs)
        assert completion - n <= committed <= completion - n + n * k
        assert [rec.metrics[f"accept_rate_pos{i}"] for i in range(1, k + 1)] == acc.per_position
        assert rec.metrics["accept_len_request_weighted"] == pytest.approx(rec.metrics["accept_len"])
        assert "accept_rate_pos%d" % (k + 1) not in rec.metrics
    c = MlflowClient(headline_sweep.uri)
    for rec in recs:
        # each job's own charts on its child run (issue 44: the README says so), drawn when the sweep ended
        own = {a.path: a.file_size for a in c.list_artifacts(rec.mlflow_run_id, "plots")}
        assert set(own) == {"plots/acceptance_histogram.png", "plots/accept_rate_by_position.png"}, own
        assert min(own.values()) > 10_000, own
        logged = c.get_run(rec.mlflow_run_id).data.metrics
        assert logged["accept_rate_pos1"] == pytest.approx(rec.metrics["accept_rate_pos1"], abs=1e-4)
    parent = c.get_run(c.get_run(recs[0].mlflow_run_id).data.tags["mlflow.parentRunId"])
    plots = {a.path for a in c.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/acceptance_histogram.png", "plots/accept_rate_by_position.png"} <= plots
    # two runs per job: no spread can be judged, so no cell competes -- and the tag says so
    assert parent.data.tags["recommendation"] == (
        "cannot decide: no stable cell: 4 of 4 noisy: unknown spread with 2 run(s) (< 3); "
        "rerun with benchmark.runs=3 or more (the protocol's 5)"
    )
    doc = json.loads(open(c.download_artifacts(parent.info.run_id, "recommendation.json", str(tmp_path))).read())
    assert len(doc["verdicts"]) == 4
    assert {v["reason"] for v in doc["verdicts"]} == {"noisy: unknown spread with 2 run(s) (< 3)"}
    summary = (sweep / "sweep_summary.txt").read_text()
    assert "acceptance rate by draft position" in summary and "recommendation: cannot decide" in summary
