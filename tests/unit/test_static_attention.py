"""The static path's bmm attention (the CUDA path's default) against SDPA, for multi-head and
grouped-query targets (a real-shape target is GQA: 32 query heads over 8 kv heads), one or several rows
of one or several tokens, the multi-query P @ V split included."""

import pytest
import torch
import torch.nn.functional as F

from spec_decode.engines.embedded.kvcache import PV_SPLIT, StaticKVCache

pytestmark = pytest.mark.unit


def attend_all_layers(attention: str, nh: int, nkv: int, b: int, t: int, seed: int = 0) -> list[torch.Tensor]:
    """Two layers' attention of one forward (b rows of t tokens at different positions, each in its own
    slot) over a cache that already holds random keys, with ``attention`` "bmm" or "sdpa"."""
    gen = torch.Generator().manual_seed(seed)
    hd, slots = 16, 8 * PV_SPLIT
    cache = StaticKVCache(2, nkv, slots, hd, slots=b + 1)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache.prepare_graph_ops(attention)
    slot_ids = torch.arange(b).flip(0)  # rows in other slots than their index
    rows = cache.rows(slot_ids, t)
    pos = torch.cat([torch.arange(t) + 5 + 11 * i for i in range(b)])
    mask = rows.mask(pos)
    outs = []
    for layer in range(2):  # the second layer reuses the forward's mask rows
        q = torch.randn(1, nh, b * t, hd, generator=gen)
        k, v = torch.randn(1, nkv, b * t, hd, generator=gen), torch.randn(1, nkv, b * t, hd, generator=gen)
        outs.append(rows.attend(layer, q, k, v, pos, mask))
    return outs


@pytest.mark.parametrize("nh,nkv", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("b,t", [(1, 1), (1, 4), (3, 1), (3, 4)])
def test_bmm_attention_equals_sdpa_for_grouped_query_heads(nh, nkv, b, t, monkeypatch):
    want = attend_all_layers("sdpa", nh, nkv, b, t)

    def no_sdpa(*a, **kw):
        raise AssertionError("the bmm path fell back to SDPA")

    monkeypatch.setattr(F, "scaled_dot_product_attention", no_sdpa)  # GQA used to fall back silently
    got = attend_all_layers("bmm", nh, nkv, b, t)
    for layer, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape == (1, nh, b * t, 16)
        assert torch.allclose(g, w, atol=1e-5), f"layer {layer}: max error {float((g - w).abs().max()):.2e}"
