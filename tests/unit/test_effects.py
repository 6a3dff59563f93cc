"""Issue 44: the sweep summary says per axis whether it mattered, by intervals ("nccl: no effect detected
here (A/A)"), and the recommendation does not present a pick from 1 stable cell of 8 as an answer.
Records carry real runs and the aggregates analysis.finish computes from them (stats.summarize)."""

import pytest

from spec_decode.analysis import effects, recommend
from spec_decode.views import report

from .test_recommend import NOISY, cell, steady

pytestmark = pytest.mark.unit

SPEEDUP = {1: 1.03, 2: 1.14, 3: 1.43, 5: 1.44}  # the README's CPU sweep, per step count


def cpu_cell(steps: int, nccl: str, tput: list[float], shift: float = 0.0):
    s = SPEEDUP[steps] + shift
    rec = cell(steps, tput, nccl, speedup=(s, s - 0.04, s + 0.04))
    rec.config["hardware"] = {"name": "cpu", "device": "cpu"}
    return rec


def sweep(noisy_but_one: bool = False, tuned_shift: float = 0.03):
    """spec.steps=1,2,3,5 x nccl=tuned,default on a CPU: tuned drawn above default at every step by noise
    smaller than the intervals (the issue's plot)."""
    recs = []
    for steps in SPEEDUP:
        for nccl, shift in (("tuned", tuned_shift), ("default", 0.0)):
            stable = not noisy_but_one or (steps, nccl) == (2, "default")
            recs.append(cpu_cell(steps, nccl, steady(300 * SPEEDUP[steps]) if stable else NOISY, shift))
    return recs


def test_nccl_on_a_cpu_is_no_effect_detected_and_steps_is_an_effect():
    by_axis = {e.axis: e for e in effects.effects(sweep())}
    assert set(by_axis) == {"nccl", "spec.steps"}
    nccl, steps = by_axis["nccl"], by_axis["spec.steps"]
    assert (nccl.verdict, nccl.points, nccl.differ) == ("no effect detected", 4, [])
    assert steps.verdict == "effect" and steps.points == 2 and steps.differ_points == 2
    assert "at nccl=default: spec.steps=1 [0.990, 1.070] vs spec.steps=3 [1.390, 1.470]" in steps.differ
    assert "at nccl=default: spec.steps=3 [1.390, 1.470] vs spec.steps=5 [1.400, 1.480]" not in steps.differ
    lines = effects.describe(effects.effects(sweep()))
    assert lines[0] == (
        "what each axis changed (95% intervals of speedup_vs_baseline, cells matched on every other axis):"
    )
    assert (
        "  nccl: no effect detected here (A/A): the intervals of tuned, default overlap at every matched point "
        "(4 of 4); on a CPU nothing uses NCCL"
    ) in lines
    text, _ = report.sweep_summary(sweep())
    assert "  nccl: no effect detected here (A/A)" in text  # the sweep summary says it


def test_on_one_gpu_the_engines_recorded_answer_labels_the_nccl_axis():
    """Issue 41: at tp 1 the embedded engine makes no process group; without the engine's answer a GPU
    sweep's nccl axis carries no note (NCCL may have run)."""
    why = "at tp 1 (the embedded engine makes no process group: no NCCL runs)"
    recs = sweep()
    for r in recs:
        r.config["hardware"] = {"name": "h100x1", "device": "cuda"}
    assert {e.axis: e for e in effects.effects(recs)}["nccl"].note == ""
    for r in recs:
        r.engine.nccl_inert = why
    assert {e.axis: e for e in effects.effects(recs)}["nccl"].note == why
    assert any(line.endswith(f"(4 of 4); {why}") for line in effects.describe(effects.effects(recs)))


def test_a_real_nccl_difference_is_an_effect_at_its_points():
    nccl = {e.axis: e for e in effects.effects(sweep(tuned_shift=0.2))}["nccl"]
    assert nccl.verdict == "effect" and nccl.differ_points == 4
    assert nccl.differ[0] == "at spec.steps=1: nccl=tuned [1.190, 1.270] vs nccl=default [0.990, 1.070]"


def test_one_stable_cell_of_eight_is_no_answer():
    """The issue's CPU sweep: 7 of 8 cells noisy; steps=2 was recommended as 'the only competing cell'."""
    rec = recommend.recommend(sweep(noisy_but_one=True))
    assert rec.decision == "cannot decide" and rec.steps is None
    # the steps=1 cells lie below it; the other 5 noisy cells reach its lower bound 1.10
    assert rec.reason == (
        "1 of 8 cell(s) compete, and 5 noisy cell(s) could be better than the best of them: "
        "nccl=default,spec.steps=2 speedup_vs_baseline 95% CI [1.100, 1.180] vs nccl=tuned,spec.steps=5 "
        "[1.430, 1.510] (noisy); rerun with more runs (benchmark.runs) or on a quieter machine"
    ), rec.reason


def test_a_noisy_cell_clearly_below_the_best_does_not_block_the_pick():
    recs = [cell(1, steady(300)), cell(2, steady(600)), cell(3, [200.0, 260.0, 320.0, 240.0, 290.0])]
    rec = recommend.recommend(recs)
    assert (rec.decision, rec.steps) == ("recommend", 2), rec.reason
    assert not {v.steps: v for v in rec.verdicts}[3].stable
