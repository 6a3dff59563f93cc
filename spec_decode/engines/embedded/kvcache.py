"""KV caches: the incremental one (batch 1, host positions) and the static one of the CUDA-graph path
(request slots, positions as device tensors)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spec_decode.engines.embedded import slot_attention


class KVCache:
    """Preallocated per-layer K/V for batch 1. Rolling back only lowers ``length``: attention reads
    ``[:length]``, so stale slots beyond it are never seen and are overwritten by the next write."""

    def __init__(
        self, layers: int, kv_heads: int, max_len: int, head_dim: int, device=None, dtype: torch.dtype = torch.float32
    ):
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
            q,
            self.k[layer, :, :, :end],
            self.v[layer, :, :, :end],
            attn_mask=mask,
            enable_gqa=q.shape[1] != k.shape[1],
        )


PV_SPLIT = 8  # slot chunks of the static path's multi-query P @ V ("bmm" attention, T > 1)


class StaticKVCache:
    """The KV cache of the static (CUDA-graph) path: every shape fixed, positions given as a device
    tensor. It holds ``slots`` request slots (one row of K/V per slot, SGLang's req_to_token pool
    in miniature; the last one a scratch slot for a bucket's padding rows, never a request's). A
    forward of B rows of T tokens runs through ``rows(slot_ids, t)``: the rows' new K/V are written
    at (slot, pos) and each row attends over all ``max_len`` keys of its own slot under a mask
    ``key <= pos``, so a slot beyond a query's position (stale, empty, or written by a padded
    position past the row's length) is never seen and is overwritten before it is. ``length`` is host
    bookkeeping only (per request: ``SlotCache``)."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        device=None,
        dtype: torch.dtype = torch.float32,
        slots: int = 1,
    ):
        self.k = torch.zeros(layers, slots, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.keys = torch.arange(max_len, device=device)
        self.max_len, self.slots = max_len, slots
        self.mask_table: torch.Tensor | None = None  # (max_len, max_len) additive, prepare_graph_ops
        self.attention = "sdpa"  # or "bmm", "slots", "slots1" (prepare_graph_ops)

    def prepare_graph_ops(self, attention: str = "sdpa") -> None:
        """Fewer kernels per step: the additive mask of every position precomputed (one gather per
        forward instead of a compare per forward plus SDPA's bool-to-float conversion per layer), and
        ``attention`` "bmm" = baddbmm(mask, q, k^T) + softmax + bmm (3 kernels) instead of SDPA, or
        "slots": slot_attention's Triton kernels, reading each row's slot in place up to its position
        (CUDA, bf16/fp16; no mask, no gather), or "slots1": the same in one kernel a layer instead of three
        (``slot_attention.attend_slots1``)."""
        if attention not in ("sdpa", "bmm", "slots", "slots1"):
            raise ValueError(f"attention must be 'sdpa', 'bmm', 'slots' or 'slots1', not {attention!r}")
        if attention in ("slots", "slots1"):
            why = slot_attention.unavailable_reason(self.k)
            if why:
                raise ValueError(f"attention {attention!r} {why}")
        keys = self.keys.to(torch.float32)
        self.mask_table = torch.zeros(self.max_len, self.max_len, device=self.k.device, dtype=self.k.dtype).masked_fill(
            keys[None, :] > keys[:, None], float("-inf")
        )
        self.attention = attention

    def rows(self, slot_ids: torch.Tensor, t: int) -> CacheRows:
        """The view a forward of ``slot_ids.shape[0]`` rows of ``t`` tokens each runs on."""
        return CacheRows(self, slot_ids, t)


def slot_rows(store: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
    """``store.index_select(0, slot_ids)``, the same bytes, copied as 8-byte words where a row allows it:
    torch's kernel for a few indices moves one element per thread step, so a bf16 slot (2-byte elements)
    copied at ~0.8 TB/s on an H200 (9.6 us for an 8B-shaped layer's 4 MiB K slot; 67 such copies were
    0.62 ms of a 6.74 ms decode step, benchmarks/gpu/real_shape.py --kernels)."""
    words = store.is_contiguous() and (store.shape[-1] * store.element_size()) % 8 == 0
    # torch.compile (StaticRunner's ``compile``) cannot trace a host address; it only sees a cache's
    # layer views, whose offsets are whole layers of such rows, so 8-byte aligned
    if words and (torch.compiler.is_compiling() or store.data_ptr() % 8 == 0):
        return store.view(torch.int64).index_select(0, slot_ids).view(store.dtype)
    return store.index_select(0, slot_ids)


class CacheRows:
    """B rows of T tokens each over a StaticKVCache: what ``forward_static`` takes as its cache. The
    forward's tokens are packed row after row (1, B*T) and ``pos`` is (B*T,); ``slot_ids`` (B,) is a
    device tensor (a shape's buffer), so a CUDA graph replays for whatever slots the rows hold."""

    def __init__(self, cache: StaticKVCache, slot_ids: torch.Tensor, t: int):
        self.cache, self.slot_ids, self.t, self.b = cache, slot_ids, t, slot_ids.shape[0]
        heads = torch.arange(cache.k.shape[2], device=slot_ids.device)
        self._head_rows = heads[None, :, None]  # (1, Hkv, 1)
        self._where: torch.Tensor | None = None

    def mask(self, pos: torch.Tensor) -> torch.Tensor:
        """(B*T, max_len), additive (graph_ops) or bool; also where this forward writes (once per forward)."""
        c, b, t = self.cache, self.b, self.t
        if c.attention in ("slots", "slots1"):  # the kernels mask by position themselves, write at (slot, pos)
            return None
        # flat index of (slot, head, pos) in a layer's (slots * Hkv * max_len) rows, ordered (B, Hkv, T)
        self._where = (
            (self.slot_ids.view(b, 1, 1) * c.k.shape[2] + self._head_rows) * c.max_len + pos.view(b, 1, t)
        ).reshape(-1)
        if c.mask_table is not None:
            return c.mask_table.index_select(0, pos)  # 0 or -inf
        return c.keys[None, :] <= pos[:, None]

    def attend(self, layer: int, q, k, v, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q (1, H, B*T, hd), k/v (1, Hkv, B*T, hd) -> (1, H, B*T, hd), each row over its own slot."""
        c = self.cache
        compiling = torch.compiler.is_compiling()
        if c.attention == "slots":
            fn = torch.ops.spec_decode.attend_slots if compiling else slot_attention.attend_slots
            return fn(q, k, v, c.k, c.v, layer, self.slot_ids, pos, self.t)
        if c.attention == "slots1":
            fn = torch.ops.spec_decode.attend_slots1 if compiling else slot_attention.attend_slots1
            return fn(q, k, v, c.k, c.v, layer, self.slot_ids, pos, self.t)
        # under torch.compile (StaticRunner's ``compile``) one opaque op: traced, the in-place cache write
        # became a copy of the layer's whole store (every slot) per layer
        fn = torch.ops.spec_decode.attend_rows if compiling else attend_rows
        return fn(q, k, v, c.k, c.v, layer, self._where, self.slot_ids, mask, self.t, c.attention == "bmm")


def attend_rows(q, k, v, k_store, v_store, layer: int, where, slot_ids, mask, t: int, bmm: bool) -> torch.Tensor:
    """CacheRows.attend's work: write the rows' new K/V at ``where`` in layer ``layer`` of the stores
    (layers, slots, Hkv, max_len, hd), gather each row's slot, attend under ``mask``."""
    kl, vl = k_store[layer], v_store[layer]  # (slots, Hkv, max_len, hd)
    b = slot_ids.shape[0]
    nh, nkv, hd, slots = q.shape[1], k.shape[1], q.shape[-1], k_store.shape[3]
    for store, new in ((kl, k), (vl, v)):
        store.view(-1, hd).index_copy_(0, where, new[0].view(nkv, b, t, hd).transpose(0, 1).reshape(-1, hd))
    # each row's slot, gathered (a device index: no host read, so capturable): (B, Hkv, max_len, hd)
    keys, values = slot_rows(kl, slot_ids), slot_rows(vl, slot_ids)
    qr = q[0].view(nh, b, t, hd).transpose(0, 1)  # (B, H, T, hd)
    # bmm for multi-head targets only: a grouped-query bf16 target (the 8B shape) runs SDPA, cuDNN's
    # flash kernel on an H200 (5.7 us a layer; a grouped bmm measured slower: 7456 vs 6740 us a decode)
    if bmm and nh == nkv:
        n = b * nh
        m = mask.view(b, 1, t, slots)
        m = m[0] if b == 1 else m.expand(b, nh, t, slots).reshape(n, t, slots)
        scores = torch.baddbmm(m, qr.reshape(n, t, hd), keys.reshape(n, slots, hd).transpose(1, 2), alpha=hd**-0.5)
        p = torch.softmax(scores, -1)
        vals = values.reshape(n, slots, hd)
        if t == 1 or slots % PV_SPLIT:
            out = torch.bmm(p, vals)
        else:
            # T > 1: cuBLAS runs (heads, T, slots) @ (heads, slots, hd) as one small tile per head
            # looping over all slots; PV_SPLIT * heads products over slots / PV_SPLIT, then a sum,
            # took 2/3 of the time on an H200 (benchmarks/gpu/engine_profile.py --attention-micro).
            chunk = slots // PV_SPLIT
            pp = p.view(n, t, PV_SPLIT, chunk).transpose(1, 2).reshape(n * PV_SPLIT, t, chunk)
            part = torch.bmm(pp, vals.reshape(n * PV_SPLIT, chunk, hd))
            out = part.view(n, PV_SPLIT, t, hd).sum(1)
        out = out.view(b, nh, t, hd)
    else:
        out = F.scaled_dot_product_attention(
            qr, keys, values, attn_mask=mask.view(b, 1, t, slots), enable_gqa=nh != nkv
        )
    return out.transpose(0, 1).reshape(1, nh, b * t, hd)


# The same function as an operator that torch.compile leaves whole (it mutates the stores in place).
@torch.library.custom_op("spec_decode::attend_rows", mutates_args=("k_store", "v_store"))
def _attend_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
    layer: int,
    where: torch.Tensor,
    slot_ids: torch.Tensor,
    mask: torch.Tensor,
    t: int,
    bmm: bool,
) -> torch.Tensor:
    return attend_rows(q, k, v, k_store, v_store, layer, where, slot_ids, mask, t, bmm).contiguous()


@_attend_op.register_fake
def _(q, k, v, k_store, v_store, layer, where, slot_ids, mask, t, bmm):
    return q.new_empty(q.shape)


class SlotCache:
    """A request's cache on the static path: host bookkeeping of its slot (the K/V live in the
    runner's StaticKVCache) -- ``length`` (committed tokens) and ``crop``, as KVCache's."""

    def __init__(self, slot: int, max_len: int):
        self.slot, self.max_len, self.length = slot, max_len, 0

    def crop(self, n: int) -> None:
        self.length = n

    def settle(self, t: int, accepted: int) -> None:
        """A verify of ``t`` tokens counted ``t`` in ``length`` when launched (its counts stay on the
        device); its result, processed, gives the committed ``accepted + 1``."""
        self.length -= t - (accepted + 1)


def causal_mask(start: int, t: int, device=None) -> torch.Tensor | None:
    """Query i (at position start+i) sees keys at positions <= start+i. SDPA's ``is_causal`` aligns
    its mask to the top-left corner, which is wrong for a multi-token step on a non-empty cache."""
    if t == 1:
        return None
    keys = torch.arange(start + t, device=device)
    queries = torch.arange(start, start + t, device=device)
    return keys[None, :] <= queries[:, None]
