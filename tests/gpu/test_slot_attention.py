"""The static path's in-place slot attention (slot_attention.py, Triton; marker `gpu`, never in CI):

    timeout 600 python -m pytest -p no:xdist -m gpu -s tests/gpu/test_slot_attention.py

- the kernels against the default path (kvcache.attend_rows: write, gather, SDPA under the mask) on
  random bf16 stores: grouped-query and multi-head, batch 1 and 3 rows of 1 and 4 tokens, positions
  at 0 and at the end of the context; the stores equal after the write, the outputs within bf16
  rounding;
- captured in a CUDA graph and replayed for other slots and positions: equal to the eager call;
- a small bf16 synthetic pair decoding on the compiled static path (the server's
  --enable-torch-compile, where "slots" is the default): graph replays equal the same compiled shapes
  run eagerly token for token, and the logits of a teacher-forced sequence agree with the SDPA path;
- the same for ``attend_slots1`` (the three kernels in one; "slots1"): each case above, in a graph, and
  on the compiled path.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from spec_decode.engines.embedded import slot_attention  # noqa: E402
from spec_decode.engines.embedded.decoding import Decoder  # noqa: E402
from spec_decode.engines.embedded.graphs import StaticRunner  # noqa: E402
from spec_decode.engines.embedded.kvcache import StaticKVCache, attend_rows  # noqa: E402
from spec_decode.engines.embedded.model import load_drafter, load_target  # noqa: E402

DEV = "cuda"


def case(nh, nkv, hd, b, t, max_len, seed=0, slots=4, layers=2, at_end=False):
    g = torch.Generator(device=DEV).manual_seed(seed)
    c = StaticKVCache(layers, nkv, max_len, hd, device=DEV, dtype=torch.bfloat16, slots=slots)
    c.k.copy_(torch.randn(c.k.shape, generator=g, device=DEV))
    c.v.copy_(torch.randn(c.v.shape, generator=g, device=DEV))
    slot_ids = torch.randperm(slots, device=DEV, generator=g)[:b]
    starts = torch.randint(0, max_len - t, (b,), device=DEV, generator=g)
    starts[0] = max_len - t if at_end else 0  # the first row at the context's start (or end)
    pos = (starts[:, None] + torch.arange(t, device=DEV)).reshape(-1)
    q = torch.randn(1, nh, b * t, hd, generator=g, device=DEV).to(torch.bfloat16)
    k = torch.randn(1, nkv, b * t, hd, generator=g, device=DEV).to(torch.bfloat16)
    v = torch.randn(1, nkv, b * t, hd, generator=g, device=DEV).to(torch.bfloat16)
    return c, q, k, v, slot_ids, pos


@pytest.mark.parametrize(
    "nh,nkv,hd,b,t,max_len,at_end",
    [
        (32, 8, 128, 1, 1, 2048, False),  # the 8B shape's decode step
        (32, 8, 128, 1, 1, 2048, True),
        (32, 8, 128, 3, 4, 2048, False),  # a verify of 3 rows
        (8, 8, 64, 2, 4, 1024, True),  # multi-head
        (8, 2, 48, 2, 3, 300, False),  # head_dim not a power of two
    ],
)
@pytest.mark.parametrize("fn", ["attend_slots", "attend_slots1"])
def test_kernels_match_the_default_path(nh, nkv, hd, b, t, max_len, at_end, fn):
    c, q, k, v, slot_ids, pos = case(nh, nkv, hd, b, t, max_len, at_end=at_end)
    ks, vs = c.k.clone(), c.v.clone()
    rows = c.rows(slot_ids, t)
    mask = rows.mask(pos)  # also sets where the rows write (rows._where)
    want = attend_rows(q, k, v, c.k, c.v, 1, rows._where, slot_ids, mask, t, False)
    got = getattr(slot_attention, fn)(q, k, v, ks, vs, 1, slot_ids, pos, t)
    assert torch.equal(ks, c.k) and torch.equal(vs, c.v), "the write differs from index_copy_'s"
    err = (got.float() - want.float()).abs().max().item()
    assert err < 3e-2, f"max abs error {err}"  # bf16 outputs of magnitude ~1: a few ulps


@pytest.mark.parametrize("name", ["attend_slots", "attend_slots1"])
def test_replays_in_a_cuda_graph_for_other_slots_and_positions(name):
    fn = getattr(slot_attention, name)
    c, q, k, v, slot_ids, pos = case(32, 8, 128, 2, 4, 2048)
    ks, vs = c.k.clone(), c.v.clone()
    slot_buf, pos_buf = slot_ids.clone(), pos.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(q, k, v, ks, vs, 0, slot_buf, pos_buf, 4)  # compile the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn(q, k, v, ks, vs, 0, slot_buf, pos_buf, 4)
    for new_slots, new_pos in ((torch.tensor([3, 1]), torch.tensor([5, 6, 7, 8, 2000, 2001, 2002, 2003])),
                               (torch.tensor([0, 2]), torch.tensor([0, 1, 2, 3, 100, 101, 102, 103]))):  # fmt: skip
        slot_buf.copy_(new_slots), pos_buf.copy_(new_pos)
        ref_k, ref_v = ks.clone(), vs.clone()
        want = fn(q, k, v, ref_k, ref_v, 0, slot_buf, pos_buf, 4)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(ks, ref_k) and torch.equal(vs, ref_v)


def test_compiled_slots_path_replays_like_its_eager_run_and_agrees_with_sdpa(bf16_pair):
    tdir, ddir = bf16_pair
    target = load_target(tdir, DEV)
    drafter = load_drafter(ddir, target, DEV)
    assert target.lm_head.weight.dtype == torch.bfloat16
    ids = list(b"def fibonacci(n):\n    return")
    for steps, d in ((0, None), (3, drafter)):
        graph = StaticRunner(target, d, steps, use_graphs=True, compile=True)
        eager = StaticRunner(target, d, steps, use_graphs=False, compile=True)
        assert graph.attention == "slots" == eager.attention and graph.tcache.attention == "slots"
        assert graph.graphs and graph.capture_error is None
        g = Decoder(target, d, steps, graph).generate(ids, 200)
        e = Decoder(target, d, steps, eager).generate(ids, 200)
        assert g.output_ids == e.output_ids, f"steps={steps}: compiled graph replay differs from compiled eager"
        assert (g.verify_ct, g.correct_drafts) == (e.verify_ct, e.correct_drafts)
    # teacher-forced logits, one position at a time: slots against SDPA on the same uncompiled shapes
    seq = torch.tensor(list(b"def fibonacci(n):\n    # return the n-th Fibonacci number\n" * 4), device=DEV)
    logits = {}
    for attention in ("sdpa", "slots", "slots1"):
        cache = target.new_static_cache(2)
        cache.prepare_graph_ops(attention)
        slot = torch.tensor([0], device=DEV)
        out = []
        with torch.no_grad():
            for i in range(len(seq)):
                rows = cache.rows(slot, 1)
                lg, _ = target.forward_static(seq[i : i + 1][None], torch.tensor([i], device=DEV), rows)
                out.append(lg[0].float())
        logits[attention] = torch.stack(out)
    for name in ("slots", "slots1"):
        a, b = logits["sdpa"], logits[name]
        rel = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
        same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        print(
            f"\n{name} vs sdpa, {len(seq)} teacher-forced positions: max relative logit error {rel:.4f}, "
            f"argmax {same:.3f}"
        )
        assert rel < 0.05 and same > 0.9, name


def test_compiled_slots1_path_replays_like_its_eager_run(bf16_pair):
    """attention "slots1" (one kernel a layer, its counters made before the capture) on the compiled static
    path: graph replays equal the same compiled shapes run eagerly, baseline and steps 3."""
    tdir, ddir = bf16_pair
    target = load_target(tdir, DEV)
    drafter = load_drafter(ddir, target, DEV)
    ids = list(b"def fibonacci(n):\n    return")
    for steps, d in ((0, None), (3, drafter)):
        graph = StaticRunner(target, d, steps, use_graphs=True, compile=True, attention="slots1")
        eager = StaticRunner(target, d, steps, use_graphs=False, compile=True, attention="slots1")
        assert graph.tcache.attention == "slots1" and graph.graphs and graph.capture_error is None
        g = Decoder(target, d, steps, graph).generate(ids, 200)
        e = Decoder(target, d, steps, eager).generate(ids, 200)
        assert g.output_ids == e.output_ids, f"steps={steps}: slots1 graph replay differs from its eager run"
