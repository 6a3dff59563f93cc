"""MLflow run names lead with what varies; metrics are logged at the precision of their unit."""

import pytest

from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.views.mlflow_run import display_name, rounded
from spec_decode.views.tracking import experiment_tags

pytestmark = pytest.mark.unit


def rec(name: str, role: str = "spec", steps: int = 3) -> JobRecord:
    return JobRecord(
        role=role,
        name=name,
        experiment="x",
        config={"spec": {"steps": steps}},
        config_hash="",
        engine=EngineInfo("embedded"),
        speculative=role == "spec",
    )


@pytest.mark.parametrize(
    "name,role,steps,want",
    [
        ("nccl=default,spec.steps=3", "spec", 3, "steps=3 nccl=default"),
        ("baseline,nccl=default", "baseline", 0, "baseline nccl=default"),
        ("", "spec", 2, "steps=2"),  # defaults: the step count still shows
        ("baseline", "baseline", 0, "baseline"),
        ("benchmark.max_new_tokens=48,nccl=tuned,spec.steps=1", "spec", 1, "steps=1 nccl=tuned max_new_tokens=48"),
        ("drafter.layer_ids=[1,3,4],spec.steps=5", "spec", 5, "steps=5 layer_ids=[1,3,4]"),
    ],
)
def test_run_name_leads_with_what_varies(name, role, steps, want):
    assert display_name(rec(name, role, steps)) == want


def test_metrics_are_rounded_by_unit():
    assert rounded("throughput_tok_s", 351.23456) == 351.2
    assert rounded("speedup_vs_baseline_ci95_lo", 1.234567) == 1.2346
    assert rounded("cycle_ms", 7.123456) == 7.123
    assert rounded("other_pct", 12.3456) == 12.35
    assert rounded("throughput_tok_s_cv", 0.0312345) == 0.0312
    assert rounded("nccl_allreduce_us_4096", 12.3456) == 12.35


def test_experiment_opens_in_the_runs_view_with_a_saved_view():
    import json

    tags = experiment_tags(expanded=["abc"])
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.spec-decode-speedup"])
    assert view["name"] == "speedup by steps" and isinstance(view["createdAt"], int)
    state = json.loads(view["state"])
    assert state["selectedColumns"][:2] == ["params.`spec.steps`", "params.`nccl`"]
    assert state["runsExpanded"] == {"abc": True}


def test_a_baseline_reports_no_step_count():
    from spec_decode.views.mlflow_run import params_of

    base = JobRecord(
        role="baseline",
        name="baseline,nccl=default",
        experiment="x",
        speculative=False,
        config={"spec": {"steps": 2, "topk": 1}, "nccl": {"name": "default"}},
        config_hash="",
        engine=EngineInfo("embedded"),
    )
    p = params_of(base)
    assert (p["spec.steps"], p["spec.topk"], p["nccl"]) == ("none", "none", "default")
    assert params_of(rec("nccl=default,spec.steps=3"))["spec.steps"] == "3"
