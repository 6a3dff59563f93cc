"""The static path's slot gather (kvcache.slot_rows): the bytes of ``index_select`` over request slots,
copied as 8-byte words where a row allows it, torch's own copy where it does not."""

import pytest
import torch

from spec_decode.engines.embedded.kvcache import slot_rows

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [24, 128, 3])  # 3 x 2 bytes: no whole words, the plain copy
def test_slot_rows_is_index_select_bit_for_bit(dtype, head_dim):
    cache = torch.randn(2, 5, 2, 16, head_dim).to(dtype)  # (layers, slots, kv heads, max_len, head_dim)
    cache[1, 3, 0, 0, 0] = float("nan")  # any bit pattern survives
    layer = cache[1]  # a view at an offset, as attend's c.k[layer]
    ids = torch.tensor([3, 0, 3, 4])
    got, want = slot_rows(layer, ids), layer.index_select(0, ids)
    assert got.dtype == dtype and got.shape == want.shape == (4, 2, 16, head_dim)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))  # the bytes, so NaN == NaN
    got.zero_()  # a copy, never a view of the cache
    assert torch.equal(layer.index_select(0, ids).view(torch.uint8), want.view(torch.uint8))
