"""What the host issues per speculative cycle on the static path, outside the shapes themselves (issue 41:
on the tiny model a cycle is host-bound on an H200, and the VM's host slowed ~2x for minutes, so every
operation the host issues per cycle is exposed to it).

On CUDA each shape is one graph replay; the host's other operations are small kernels and copies, each
an ATen call through the dispatcher. Counted here on CPU (the same code path, the shapes run eagerly
and are not counted): every non-view ATen op a cycle issues outside ``StaticRunner.run``. The draft
chain is one shape (no per-step copies: the count does not grow with the step count), the positions
come from the slots' lengths inside the shapes, and the re-extend reads the verify's buffers in place.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spec_decode.engines.embedded.batch import ForwardMode, ScheduleBatch
from spec_decode.engines.embedded.decoding import Decoder, ForcedAcceptance
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.model import load_drafter, load_target

ROOT = Path(__file__).resolve().parents[2]
MAX_HOST_OPS = 16  # per cycle at batch size 1; 31 before the in-shape positions and hand-over, more before the chain
CYCLES = 4


class _Count(TorchDispatchMode):
    """Counts the ATen ops that do work (not views, not autograd bookkeeping) while ``on``."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.on = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if self.on and not func.is_view and "lift_fresh" not in name and "detach" not in name:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    target = load_target(ROOT / "models/tiny/target")
    return target, load_drafter(ROOT / "models/tiny/drafter", target)


def host_ops_per_cycle(models, steps: int, forced: ForcedAcceptance | None = None) -> tuple[float, dict]:
    target, drafter = models
    runner = StaticRunner(target, drafter, steps, use_graphs=False)
    dec = Decoder(target, drafter, steps, runner, forced=forced)
    count, shapes = _Count(), []
    run = runner.run

    def uncounted(name):  # a graph replay on CUDA: one host call, its inside not the host's
        shapes.append(name)
        count.on = False
        try:
            return run(name)
        finally:
            count.on = True

    runner.run = uncounted
    req = dec.new_req("0", list(b"The strange sailor waits in the forest."), 64)
    with torch.inference_mode():
        dec.run_batch(ScheduleBatch([req], ForwardMode.EXTEND))
        dec.run_batch(ScheduleBatch([req], ForwardMode.DECODE))  # first use: flags set once
        shapes.clear()
        with count:
            for _ in range(CYCLES):
                dec.run_batch(ScheduleBatch([req], ForwardMode.DECODE))
    return sum(count.ops.values()) / CYCLES, {"ops": dict(count.ops), "shapes": shapes}


@pytest.fixture(scope="module")
def steps3(models) -> float:
    """Host ops a cycle at steps 3, verified counts: the reference the other cases compare with."""
    return host_ops_per_cycle(models, 3)[0]


@pytest.mark.parametrize("steps", [3, 5])
def test_a_cycle_issues_few_host_ops_whatever_the_step_count(models, steps3, steps):
    per_cycle, seen = host_ops_per_cycle(models, steps)
    assert seen["shapes"] == ["draft@1", "verify@1", "extend@1"] * CYCLES  # one run per phase
    assert per_cycle <= MAX_HOST_OPS, seen["ops"]
    assert per_cycle == steps3  # the chain: not one copy more per step


def test_forced_acceptance_adds_only_its_counts(models, steps3):
    """Forced counts (SGLANG_SIMULATE_ACC_LEN) are the host's: their draw and the predictions' rewrite
    (host tensors, counted too), one copy of the counts a cycle and the rewritten predictions into the
    verify's buffer; no more (21 against 14 when this was written)."""
    plain = steps3
    forced, seen = host_ops_per_cycle(models, 3, ForcedAcceptance(2.0, 3, "match-expected", "real-draft-token"))
    assert forced <= plain + 8, seen["ops"]
