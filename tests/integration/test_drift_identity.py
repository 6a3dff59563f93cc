"""Issue 29 (e): drift compares a baseline only with earlier baselines of the same hardware, tp size and
engine (a real MLflow sqlite store); a tp over the useful CPU cores is warned in the sweep summary."""

import os

import pytest

from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.runner import preflight
from spec_decode.views import report
from spec_decode.views.mlflow_run import log_record
from spec_decode.views.tracking import Tracker

from ..conftest import ROOT, compose_experiment

pytestmark = pytest.mark.integration


def baseline(tp: int, tput: float, out_dir, warnings=(), engine=None, load=None) -> JobRecord:
    cfg = {
        "hardware": {"name": "cpu", "tp_size": tp},
        "model": {"name": "tiny_llama"},
        "engine": {"name": "embedded", **(engine or {})},
        "nccl": {"name": "default"},
        "drafter": {"name": "none"},
        "spec": {"steps": 2},
        "benchmark": {"max_new_tokens": 48, "prompts": "data/prompts.jsonl", "prompt_index": 0, **(load or {})},
    }
    m = {
        "throughput_tok_s": tput,
        "throughput_tok_s_ci95_lo": tput - 5,
        "throughput_tok_s_ci95_hi": tput + 5,
        "throughput_tok_s_cv": 0.01,
    }
    return JobRecord(
        role="baseline",
        name=f"baseline,tp={tp}",
        experiment="e",
        config=cfg,
        config_hash=f"h{tp}",
        engine=EngineInfo("embedded"),
        speculative=False,
        status="FINISHED",
        metrics=m,
        out_dir=str(out_dir),
        warnings=list(warnings),
    )


def test_earlier_baselines_are_those_of_the_same_tp(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", "drift", str(tmp_path / "art"), ROOT)
    old = baseline(1, 300.0, tmp_path)
    rid = tracker.client.create_run(tracker.experiment_id(), run_name="tp1").info.run_id
    log_record(tracker.client, rid, old, tmp_path)
    tracker.client.set_terminated(rid, "FINISHED")
    assert [r.throughput_tok_s for r in tracker.earlier_baselines(baseline(1, 305.0, tmp_path))] == [300.0]
    assert tracker.earlier_baselines(baseline(2, 150.0, tmp_path)) == []  # tp 2 is another setup, not drift


SERVING = {"disable_overlap_schedule": False, "cuda_graph_max_bs_decode": None, "extra_args": ["--cpu-threads", "1"]}
LOAD = {"concurrency": 1, "request_rate": None, "stream": False}


@pytest.mark.parametrize(
    ("engine", "load", "compared"),
    [
        ({}, {}, True),  # the same serving options and load (None, a list and bools as MLflow params)
        ({"disable_overlap_schedule": True}, {}, False),  # the H200's false DRIFT (2026-12-04)
        ({"extra_args": ["--cpu-threads", "2"]}, {}, False),  # a list compared after the search
        ({"cuda_graph_max_bs_decode": 4}, {}, False),
        ({}, {"request_rate": 2.0}, False),
        ({}, {"concurrency": 8}, False),
    ],
)
def test_earlier_baselines_are_those_of_the_same_serving_options_and_load(tmp_path, engine, load, compared):
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", "drift", str(tmp_path / "art"), ROOT)
    old = baseline(1, 300.0, tmp_path, engine=SERVING, load=LOAD)
    rid = tracker.client.create_run(tracker.experiment_id(), run_name="old").info.run_id
    log_record(tracker.client, rid, old, tmp_path)
    tracker.client.set_terminated(rid, "FINISHED")
    now = baseline(1, 250.0, tmp_path, engine={**SERVING, **engine}, load={**LOAD, **load})
    assert [r.throughput_tok_s for r in tracker.earlier_baselines(now)] == ([300.0] if compared else [])


@pytest.mark.parametrize(
    ("before", "now", "compared"),
    [
        ({}, {"proj_split": 0}, True),  # a record from before the option: its default is what ran
        ({"proj_split": 4}, {"proj_split": 0}, False),  # the search cannot filter a default left out: skipped after
        ({}, {"proj_split": 4}, False),
        ({"proj_split": 4}, {"proj_split": 4}, True),
    ],
)
def test_an_option_added_later_matches_earlier_records_only_at_its_default(tmp_path, before, now, compared):
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", "drift", str(tmp_path / "art"), ROOT)
    rid = tracker.client.create_run(tracker.experiment_id(), run_name="old").info.run_id
    log_record(tracker.client, rid, baseline(1, 300.0, tmp_path, engine={**SERVING, **before}, load=LOAD), tmp_path)
    tracker.client.set_terminated(rid, "FINISHED")
    now_rec = baseline(1, 250.0, tmp_path, engine={**SERVING, **now}, load=LOAD)
    assert [r.throughput_tok_s for r in tracker.earlier_baselines(now_rec)] == ([300.0] if compared else [])


def test_tp_over_the_useful_cores_is_in_the_sweep_summary(tmp_path):
    cores = len(os.sched_getaffinity(0))
    cfg = compose_experiment(f"hardware.tp_size={cores}", "drafter=none")
    warned = [w for w in preflight.check(cfg, ROOT).warnings if w.startswith(f"hardware.tp_size={cores} ranks")]
    assert warned and "not speculation" in warned[0]
    text, _ = report.sweep_summary([baseline(cores, 100.0, tmp_path, warned)])
    assert f"  warning (1 job(s)): hardware.tp_size={cores} ranks on {cores} CPU cores" in text
