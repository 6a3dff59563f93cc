"""The overlap scheduler's result copy (batch.BatchResult.copy_to_cpu / host_ids; marker `gpu`, never in CI):

    timeout 300 python -m pytest -p no:xdist -m gpu -s tests/gpu/test_overlap_copy.py

- a result's ids read on the host wait for that result's own work only, not for GPU work queued after
  it (the next cycle, launched before the result is processed): with ~0.2 s of GPU sleep queued behind
  the copy, ``host_ids`` returns the right ids well before the sleep ends;
- the bf16 pair on the graph path decodes the same tokens with the overlap scheduler on and off (the
  copy changes when the host reads, never what it reads);
- issue 41: a speculative cycle with verified counts reads nothing back: with ~0.2 s of GPU sleep queued
  before it, ``run_batch`` returns (draft, verify and re-extend queued) well before the sleep ends.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from spec_decode.engines.embedded.batch import BatchResult, ForwardMode, ScheduleBatch  # noqa: E402
from spec_decode.engines.embedded.decoding import Decoder  # noqa: E402
from spec_decode.engines.embedded.graphs import StaticRunner  # noqa: E402
from spec_decode.engines.embedded.model import load_drafter, load_target  # noqa: E402

DEV = "cuda"


def sleep_ms() -> float:
    """GPU ms of torch.cuda._sleep(400M cycles) on this device, timed with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(400_000_000)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_host_ids_wait_for_their_own_batch_not_the_work_queued_after_it():
    gpu_sleep = sleep_ms()
    assert gpu_sleep > 50, f"the GPU sleep took {gpu_sleep:.1f} ms: too short to tell a wait from none"
    ids = [torch.tensor([5, 6, 7], device=DEV), torch.tensor([9], device=DEV), torch.tensor([1, 2], device=DEV)]
    torch.cuda.synchronize()
    result = BatchResult([x * 2 for x in ids], [2, 0, 1])
    result.copy_to_cpu()
    torch.cuda._sleep(400_000_000)  # the next cycle, launched before this result is processed
    t0 = time.perf_counter()
    got = result.host_ids()
    waited_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    print(f"\nhost_ids returned after {waited_ms:.2f} ms with {gpu_sleep:.1f} ms of GPU work queued behind the copy")
    assert got == [[10, 12, 14], [18], [2, 4]]
    assert waited_ms < gpu_sleep / 4, f"host_ids waited {waited_ms:.1f} ms: it waited for the work queued after it"


def test_overlap_on_and_off_decode_the_same_tokens(bf16_pair):
    tdir, ddir = bf16_pair
    target = load_target(tdir, DEV)
    drafter = load_drafter(ddir, target, DEV)
    ids = list(b"def fibonacci(n):\n    return")
    for steps, d in ((0, None), (3, drafter)):
        runner = StaticRunner(target, d, steps, use_graphs=True)
        assert runner.graphs and runner.capture_error is None
        dec = Decoder(target, d, steps, runner)
        on, off = dec.generate(ids, 120, overlap=True), dec.generate(ids, 120, overlap=False)
        assert on.output_ids == off.output_ids, f"steps={steps}: overlap on and off decode different tokens"
        assert len(on.output_ids) == 120


def test_a_speculative_cycle_returns_before_the_gpu_work_queued_ahead_of_it(bf16_pair):
    gpu_sleep = sleep_ms()
    assert gpu_sleep > 50, f"the GPU sleep took {gpu_sleep:.1f} ms: too short to tell a wait from none"
    tdir, ddir = bf16_pair
    target = load_target(tdir, DEV)
    drafter = load_drafter(ddir, target, DEV)
    runner = StaticRunner(target, drafter, 3, use_graphs=True)
    assert runner.graphs and runner.capture_error is None
    dec = Decoder(target, drafter, 3, runner)
    req = dec.new_req("0", list(b"def fibonacci(n):\n    return"), 64)
    dec.run_batch(ScheduleBatch([req], ForwardMode.EXTEND)).host_ids()
    dec.run_batch(ScheduleBatch([req], ForwardMode.DECODE)).host_ids()  # one cycle first (lazy inits)
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # GPU work ahead of the cycle
    t0 = time.perf_counter()
    result = dec.run_batch(ScheduleBatch([req], ForwardMode.DECODE))
    result.copy_to_cpu()
    launched_ms = (time.perf_counter() - t0) * 1e3
    got = result.host_ids()
    torch.cuda.synchronize()
    print(f"\nthe steps-3 cycle was queued in {launched_ms:.2f} ms with {gpu_sleep:.1f} ms of GPU work ahead of it")
    assert 1 <= len(got[0]) <= 4 and result.accepted_drafts[0] == len(got[0]) - 1
    assert launched_ms < gpu_sleep / 4, f"run_batch took {launched_ms:.1f} ms: the cycle waited for the GPU"
