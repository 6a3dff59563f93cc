"""The static (CUDA-graph) path batched per batch-size bucket (issue 26), on CPU: the same shapes the
GPU captures, run eagerly (``StaticRunner(use_graphs=False)``, the server's test-only ``--static-path``).

- lossless at load: 16 concurrent requests (test_engine_batching's workload) give exactly the
  batch-size-1 outputs and SGLang's per-request counters, in process and from real servers at tp 1 and
  tp 2 (gloo), overlap on and off, batches that hit several buckets with padding rows, and a
  --cuda-graph-max-bs-decode below the concurrency (larger batches run eagerly, said once);
- slots: a finished request's slot is not given to a new request while a launched cycle (the overlap
  scheduler's in-flight one) still holds it, and every slot comes back;
- a re-extend pads every row to k+1 tokens: rows that accept fewer write drafter K/V past their length,
  which their mask hides and their next draft step overwrites (the equality above is the proof; here
  it is checked that such writes really happen).
"""

from __future__ import annotations

import pytest
import requests

from spec_decode.engines.embedded.buckets import bucket, capture_bs
from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.loop import BatchLoop
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.server_process import ServerProcess, free_port
from spec_decode.parsers.decode_log import read_log

from ..conftest import DRAFTER, TARGET
from .engine_args import tiny_models
from .test_engine_batching import ENGINE, SPEC, STEPS, body, post_all, workload

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models():
    return tiny_models(threads=1)


@pytest.fixture(scope="module")
def bs1(models):
    """Each request alone on the packed eager path (batch size 1, no overlap): the reference."""
    spec, base = Decoder(*models, STEPS), Decoder(models[0], None, 0)
    return {
        STEPS: [spec.generate(ids, n) for ids, n in workload()],
        0: [base.generate(ids, n) for ids, n in workload()],
    }


def run_static(models, steps: int, max_bs: int, overlap: bool, **kw):
    """The 16 requests through a BatchLoop on the static path, joining 3 at a time between steps;
    returns the requests, the decode batch sizes and the runner."""
    target, drafter = models[0], (models[1] if steps else None)
    runner = StaticRunner(target, drafter, steps, use_graphs=False, max_bs=max_bs, slots=16, **kw)
    dec = Decoder(target, drafter, steps, runner)
    sizes, held = [], []
    run_batch, release, alloc = dec.run_batch, dec.release, runner.alloc

    def observe_batch(batch):
        if batch.forward_mode.is_decode():
            sizes.append(batch.batch_size())
        return run_batch(batch)

    def in_flight():  # the slots a launched, not yet processed batch holds
        return {r.tcache.slot for r in (loop.pending[0].reqs if loop.pending else []) if r.tcache is not None}

    def observe_release(req):
        held.append(req.tcache.slot in in_flight() and req in loop.pending[0].reqs)
        release(req)

    def observe_alloc():
        cache = alloc()
        held.append(cache.slot in in_flight())
        return cache

    dec.run_batch, dec.release, runner.alloc = observe_batch, observe_release, observe_alloc
    loop = BatchLoop(dec, max_running=16, overlap=overlap)
    reqs = [dec.new_req(str(i), ids, n) for i, (ids, n) in enumerate(workload())]
    for i, r in enumerate(reqs):
        loop.add(r)
        if i % 3 == 2:
            loop.step()
            loop.step()
    loop.run_until_idle()
    assert not any(held), "a slot was released or reused while a launched cycle held it"
    return reqs, sizes, runner


def assert_same(reqs, refs, steps: int) -> None:
    for i, (r, ref) in enumerate(zip(reqs, refs)):
        assert r.output_ids == ref.output_ids, f"request {i} differs from its batch-size-1 output (steps {steps})"
        assert (r.spec_verify_ct, r.spec_num_correct_drafts, r.histogram) == (
            ref.verify_ct,
            ref.correct_drafts,
            ref.histogram,
        ), i


@pytest.mark.parametrize("steps", [STEPS, 0])
@pytest.mark.parametrize("max_bs,overlap", [(16, True), (16, False), (5, True)])
def test_static_path_batches_in_buckets_and_gives_the_batch_size_1_outputs(models, bs1, steps, max_bs, overlap):
    reqs, sizes, runner = run_static(models, steps, max_bs, overlap)
    assert_same(reqs, bs1[steps], steps)
    sizes_run = set(sizes)
    assert len({bucket(n, capture_bs(max_bs)) for n in sizes_run}) >= 3, sizes  # several buckets
    assert any(bucket(n, runner.sizes) not in (None, n) for n in sizes_run), sizes  # padding rows ran
    if max_bs < 16:
        assert max(sizes) > max_bs and f"{'verify' if steps else 'decode'}@{max(sizes)}" in runner.bufs
        assert runner.eager_above_logged
    assert sorted(runner.free_slots) == list(range(16))  # every slot came back
    if overlap and steps:
        assert sum(r.inflight_cycles for r in reqs) >= 1  # the in-flight cycles ran (and held their slots)


@pytest.mark.parametrize("attention", ["bmm", "sdpa"])
def test_the_fewer_kernel_shapes_batch_like_the_plain_ones(bs1, attention):
    """The CUDA default (graph_ops: fused norms, RoPE from rotated rows, the additive mask table, bmm
    attention over B*H rows), eagerly on CPU on fresh models (prepare_graph_ops changes them): the
    16 batched requests give the batch-size-1 outputs and counters."""
    target = load_target(TARGET)
    drafter = load_drafter(DRAFTER, target)
    reqs, sizes, runner = run_static((target, drafter), STEPS, 8, True, graph_ops=True, attention=attention)
    assert runner.graph_ops and runner.tcache.attention == attention and max(sizes) > 8
    assert_same(reqs, bs1[STEPS], STEPS)


def test_padded_reextend_rows_write_past_their_length_and_stay_lossless(models, bs1):
    """Rows that accept fewer than k drafts still run k+1 re-extend positions: count such rows."""
    target, drafter = models
    runner = StaticRunner(target, drafter, STEPS, use_graphs=False, max_bs=16, slots=16)
    dec = Decoder(target, drafter, STEPS, runner)
    padded = []
    extend = runner.extend

    def observe(caches, preds=None):
        accepted = runner.last_verify[2][: len(caches)].tolist()  # the verify's counts (on the device)
        padded.append(sum(a < STEPS for a in accepted))
        return extend(caches, preds)

    runner.extend = observe
    loop = BatchLoop(dec, max_running=16, overlap=True)
    reqs = [dec.new_req(str(i), ids, n) for i, (ids, n) in enumerate(workload())]
    for r in reqs:
        loop.add(r)
    loop.run_until_idle()
    assert_same(reqs, bs1[STEPS], STEPS)
    assert sum(padded) >= 20, padded


def static_server(tmp_path, tp: int, *flags: str) -> ServerProcess:
    port = free_port()
    argv = ENGINE + [
        "--model-path",
        str(TARGET),
        *SPEC,
        "--port",
        str(port),
        "--tp-size",
        str(tp),
        "--static-path",
        "--decode-log-interval",
        "1",
        "--max-running-requests",
        "16",
        "--random-seed",
        "0",
        *flags,
    ]
    return ServerProcess(
        argv, env={}, log_path=tmp_path / "server.log", host="127.0.0.1", port=port, startup_timeout_s=120
    )


@pytest.mark.parametrize(
    "tp,flags",
    [
        (1, []),
        (2, ["--cuda-graph-max-bs-decode", "4"]),
        (1, ["--disable-overlap-schedule", "--cuda-graph-max-bs-decode", "6"]),
    ],
)
def test_16_concurrent_requests_on_the_static_path_give_the_batch_size_1_outputs(tmp_path, bs1, tp, flags):
    with static_server(tmp_path, tp, *flags) as srv:
        info = requests.get(srv.base_url + "/server_info", timeout=10).json()
        outs = post_all(srv.base_url, [body(ids, n) for ids, n in workload()], stagger_s=0.01)
    assert info["cuda_graph"] is False and info["cuda_graph_bs"] == [] and info["static_path"] is True
    for i, (out, ref) in enumerate(zip(outs, bs1[STEPS])):
        meta = out["meta_info"]
        assert out["output_ids"] == ref.output_ids, f"request {i} differs from its batch-size-1 output"
        assert meta["spec_verify_ct"] == ref.verify_ct, i
        assert meta["spec_correct_drafts_histogram"] == ref.histogram, i
        assert meta["spec_num_correct_drafts"] == ref.correct_drafts, i
    log_text = (tmp_path / "server.log").read_text()
    running = [int(x.fields["#running-req"]) for x in read_log(tmp_path / "server.log") if x.kind == "Decode"]
    assert max(running) >= 4 and len(set(running)) >= 3, running  # batched, joins and leaves mid-run
    assert "static path: 16 request slots" in log_text
    cap = int(flags[flags.index("--cuda-graph-max-bs-decode") + 1]) if flags else 16
    said = log_text.count("above --cuda-graph-max-bs-decode")
    assert said == (tp if max(running) > cap else 0), (said, max(running), cap)  # once per rank, if ever


def test_forced_acceptance_on_the_static_path_batches_like_the_eager_path(models):
    """SGLANG_SIMULATE_ACC_LEN on a batch: the static path's re-extend takes the rewritten predictions
    and forced counts (real-draft-token: drafts and a bonus) exactly as the packed eager path does."""
    from spec_decode.engines.embedded.decoding import ForcedAcceptance

    target, drafter = models
    work = workload()[:8]
    outs = []
    for runner in (None, StaticRunner(target, drafter, STEPS, use_graphs=False, max_bs=4, slots=8)):
        forced = ForcedAcceptance(2.5, STEPS, token_mode="real-draft-token", seed=3)
        dec = Decoder(target, drafter, STEPS, runner, forced)
        loop = BatchLoop(dec, max_running=8, overlap=True)
        reqs = [dec.new_req(str(i), ids, n) for i, (ids, n) in enumerate(work)]
        for r in reqs:
            loop.add(r)
        loop.run_until_idle()
        outs.append([(r.output_ids, r.histogram) for r in reqs])
    assert outs[1] == outs[0]
    assert sum(h[1] for _, h in outs[0]) > 0 and sum(h[2] for _, h in outs[0]) > 0  # 1 and 2 drafts forced


def test_a_speculative_cycle_reads_nothing_back_from_the_device(models, bs1, monkeypatch):
    """Issue 41: the verified counts stay on the device inside a cycle (its positions, its re-extend and
    each slot's length are advanced there), so under the overlap scheduler the host can queue the next
    cycle while this one runs. Every host read of a tensor (``tolist``, ``item``, ``int``/``float``/
    ``bool`` of a tensor) raises inside ``cycle``; the results' own reads, when the loop processes them,
    stay allowed. The 16 requests still give the batch-size-1 outputs and counters."""
    import torch

    target, drafter = models
    runner = StaticRunner(target, drafter, STEPS, use_graphs=False, max_bs=16, slots=16)
    dec = Decoder(target, drafter, STEPS, runner)
    inside = []

    def no_read(name):
        original = getattr(torch.Tensor, name)

        def guarded(self, *a, **kw):
            if inside:
                raise AssertionError(f"Tensor.{name} inside a decode cycle: a host read of the device")
            return original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, guarded)

    for name in ("tolist", "item", "__int__", "__float__", "__bool__"):
        no_read(name)
    cycle, decode_cycles = dec.cycle, []

    def guarded_cycle(batch):
        if not batch.forward_mode.is_decode():
            return cycle(batch)
        inside.append(1)
        try:
            result = cycle(batch)
        finally:
            inside.pop()
        decode_cycles.append(result)
        return result

    dec.cycle = guarded_cycle
    release, settled = dec.release, []

    def check_release(req):  # every result of the request processed: the host length is the device's
        settled.append(req.tcache.length == runner.tlen[req.tcache.slot].tolist())
        release(req)

    dec.release = check_release
    loop = BatchLoop(dec, max_running=16, overlap=True)
    reqs = [dec.new_req(str(i), ids, n) for i, (ids, n) in enumerate(workload())]
    for r in reqs:
        loop.add(r)
    loop.run_until_idle()
    assert len(decode_cycles) >= 20 and all(r.accepted is not None for r in decode_cycles)
    assert_same(reqs, bs1[STEPS], STEPS)
    assert len(settled) == 16 and all(settled), settled
