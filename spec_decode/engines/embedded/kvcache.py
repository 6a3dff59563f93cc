"""KV caches: the incremental one (batch 1, host positions) and the static one of the CUDA-graph path."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Preallocated per-layer K/V for batch 1. Rolling back only lowers ``length``: attention reads
    ``[:length]``, so stale slots beyond it are never seen and are overwritten by the next write."""

    def __init__(self, layers: int, kv_heads: int, max_len: int, head_dim: int, device=None,
                 dtype: torch.dtype = torch.float32):
        self.k = torch.zeros(layers, 1, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len
        self.length = 0

    def crop(self, n: int) -> None:
        self.length = n

    def attend(self, layer: int, q, k, v, start: int, mask) -> torch.Tensor:
        end = start + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return F.scaled_dot_product_attention(
            q, self.k[layer, :, :, :end], self.v[layer, :, :, :end], attn_mask=mask,
            enable_gqa=q.shape[1] != k.shape[1],
        )


PV_SPLIT = 8  # slot chunks of the static path's multi-query P @ V ("bmm" attention, T > 1)


class StaticKVCache:
    """The KV cache of the CUDA-graph path: every shape fixed, positions given as a device tensor.
    New K/V are written at ``pos`` with ``index_copy_``; attention always reads all ``max_len`` slots
    under a mask ``key <= pos`` (a slot beyond a query's position, stale or empty, is never seen).
    ``length`` is host bookkeeping only, as in KVCache: rolling back lowers it."""

    def __init__(self, layers: int, kv_heads: int, max_len: int, head_dim: int, device=None,
                 dtype: torch.dtype = torch.float32):
        self.k = torch.zeros(layers, 1, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.keys = torch.arange(max_len, device=device)
        self.max_len = max_len
        self.length = 0
        self.mask_table: torch.Tensor | None = None  # (max_len, max_len) additive, prepare_graph_ops
        self.attention = "sdpa"  # or "bmm" (prepare_graph_ops)

    def crop(self, n: int) -> None:
        self.length = n

    def prepare_graph_ops(self, attention: str = "sdpa") -> None:
        """Fewer kernels per step: the additive mask of every position precomputed (one gather per
        forward instead of a compare per forward plus SDPA's bool-to-float conversion per layer), and
        ``attention`` "bmm" = baddbmm(mask, q, k^T) + softmax + bmm (3 kernels) instead of SDPA."""
        if attention not in ("sdpa", "bmm"):
            raise ValueError(f"attention must be 'sdpa' or 'bmm', not {attention!r}")
        keys = self.keys.to(torch.float32)
        self.mask_table = torch.zeros(self.max_len, self.max_len, device=self.k.device,
                                      dtype=self.k.dtype).masked_fill(
            keys[None, :] > keys[:, None], float("-inf"))
        self.attention = attention

    def mask(self, pos: torch.Tensor) -> torch.Tensor:
        if self.mask_table is not None:
            return self.mask_table.index_select(0, pos)  # (T, max_len): 0 or -inf
        return self.keys[None, :] <= pos[:, None]  # (T, max_len)

    def attend(self, layer: int, q, k, v, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.k[layer].index_copy_(2, pos, k)
        self.v[layer].index_copy_(2, pos, v)
        if self.attention == "bmm" and q.shape[1] == k.shape[1]:
            keys, values = self.k[layer][0], self.v[layer][0]  # (heads, max_len, hd)
            scores = torch.baddbmm(mask, q[0], keys.transpose(1, 2), alpha=q.shape[-1] ** -0.5)
            p = torch.softmax(scores, -1)
            h, t, slots = p.shape
            if t == 1 or slots % PV_SPLIT:
                return torch.bmm(p, values)[None]
            # T > 1: cuBLAS runs (heads, T, slots) @ (heads, slots, hd) as one small tile per head
            # looping over all slots; PV_SPLIT * heads products over slots / PV_SPLIT, then a sum,
            # took 2/3 of the time on an H200 (benchmarks/gpu/engine_profile.py --attention-micro).
            chunk = slots // PV_SPLIT
            pp = p.view(h, t, PV_SPLIT, chunk).transpose(1, 2).reshape(h * PV_SPLIT, t, chunk)
            part = torch.bmm(pp, values.reshape(h * PV_SPLIT, chunk, values.shape[-1]))
            return part.view(h, PV_SPLIT, t, -1).sum(1)[None]
        return F.scaled_dot_product_attention(q, self.k[layer], self.v[layer], attn_mask=mask,
                                              enable_gqa=q.shape[1] != k.shape[1])


def causal_mask(start: int, t: int, device=None) -> torch.Tensor | None:
    """Query i (at position start+i) sees keys at positions <= start+i. SDPA's ``is_causal`` aligns
    its mask to the top-left corner, which is wrong for a multi-token step on a non-empty cache."""
    if t == 1:
        return None
    keys = torch.arange(start + t, device=device)
    queries = torch.arange(start, start + t, device=device)
    return keys[None, :] <= queries[:, None]
