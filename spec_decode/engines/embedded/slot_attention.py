"""Attention that reads each row's request slot in place: the static path's attention on CUDA under
torch.compile (``StaticKVCache.prepare_graph_ops(attention="slots")``), in Triton.

The default static attention (kvcache.attend_rows) writes the rows' new K/V into the layer's store,
gathers each row's whole slot (all ``max_len`` positions, a copy) and runs SDPA over it under a
``key <= pos`` mask. On the 8B-shaped target that was, per decode step, 298 us of slot gathers, 255 us of
SDPA and 157 us of cache writes (benchmarks/gpu/real_shape.py --kernels): the gathers copy 8 MiB a
layer and SDPA reads it all again, though a row only needs its ``pos + 1`` first keys.

Here, three kernels a layer, none of them a copy:

- ``_write``: the rows' new K and V into (slot, kv head, pos) of the layer's stores (one kernel for both);
- ``_attend``: split-K flash decoding. A program takes one query row, one kv head (all of its query
  heads: grouped-query attention reads each key once per group) and one of ``splits`` chunks of the
  row's keys ``0..pos``, read in place from the row's slot; it keeps an online softmax in fp32 and
  writes its partial (max, sum, weighted values);
- ``_combine``: the partials of a (row, head) merged into the output.

``attend_slots1`` does the same in one kernel a layer (attention "slots1", a variant until measured on a
GPU): a program per (request, kv head, key chunk) writes the request's new K/V that fall in its chunk,
then attends all of the request's rows x the group's query heads over the chunk at once, each row up to
its own position; the last of a (request, kv head)'s programs to finish (a counter that it resets) merges
the chunks. Checked against ``attend_slots`` in Triton's interpreter on CPU (fp32, 40 cases: stores
equal, outputs within 8e-7), compiled for sm_90 without a GPU (Triton 3.6's ptxas: T = 1, 2, 4, 6), and by
tests/gpu/test_slot_attention.py.

Keys beyond a row's position are never read (the default path masks them after reading all of them),
so the bytes a step reads grow with the context, as in SGLang's attention backends. The grid is fixed
by the shape (rows, kv heads, splits): positions are read on the device, so a CUDA graph replays it
for any slots and positions. Rounding differs from SDPA's (fp32 online softmax over other blocks): the
GPU tests compare against the default path with a tolerance (tests/gpu/test_slot_attention.py).
"""

from __future__ import annotations

import torch

try:  # Triton comes with CUDA builds of torch; a CPU machine has none and never takes this path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None

BLOCK_N = 64  # keys per inner step
SPLITS = 16  # key chunks per (row, kv head): 16 x 8 kv heads = 128 programs at batch 1 (132 SMs)


def unavailable_reason(store: torch.Tensor) -> str | None:
    """Why the kernels cannot run on a cache of ``store``'s device and dtype, or None."""
    if triton is None:
        return "needs Triton (it comes with CUDA builds of torch; this torch has none)"
    if store.device.type != "cuda":
        return f"runs on CUDA only, not on {store.device.type}"
    if store.dtype not in (torch.bfloat16, torch.float16):
        return f"is for bf16/fp16 caches, not {store.dtype} (the fp32 tiny model keeps 'bmm')"
    return None


if triton is not None:

    @triton.jit
    def _write(
        k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, pos_ptr,
        s_kh, s_kr, s_vh, s_vr,  # new k, v (1, Hkv, R, hd): head and row strides (hd contiguous)
        s_slot, s_head, s_pos,  # layer store (slots, Hkv, max_len, hd): strides
        T: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr,
    ):  # fmt: skip
        r, g = tl.program_id(0), tl.program_id(1)
        slot = tl.load(slot_ptr + r // T)
        p = tl.load(pos_ptr + r)
        d = tl.arange(0, HDP)
        dm = d < HD
        dst = slot * s_slot + g * s_head + p * s_pos + d
        tl.store(ks_ptr + dst, tl.load(k_ptr + g * s_kh + r * s_kr + d, mask=dm), mask=dm)
        tl.store(vs_ptr + dst, tl.load(v_ptr + g * s_vh + r * s_vr + d, mask=dm), mask=dm)

    @triton.jit
    def _attend(
        q_ptr, ks_ptr, vs_ptr, slot_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr,
        s_qh, s_qr,  # q (1, H, R, hd): head, row strides
        s_slot, s_head, s_pos,  # layer store strides
        scale,
        T: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr,
        HDP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        r, g, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        slot = tl.load(slot_ptr + r // T)
        n = tl.load(pos_ptr + r) + 1  # keys 0..pos
        per = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK_N) * BLOCK_N
        lo = s * per
        hi = tl.minimum(lo + per, n)
        heads = tl.arange(0, GP)
        live = heads < GROUP
        d = tl.arange(0, HDP)
        dm = d < HD
        q = tl.load(
            q_ptr + (g * GROUP + heads)[:, None] * s_qh + r * s_qr + d[None, :],
            mask=live[:, None] & dm[None, :],
            other=0.0,
        ).to(tl.float32)
        base = slot * s_slot + g * s_head
        m = tl.full([GP], float("-inf"), tl.float32)
        l = tl.zeros([GP], tl.float32)  # noqa: E741
        acc = tl.zeros([GP, HDP], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            ok = keys < hi
            off = base + keys[:, None] * s_pos + d[None, :]
            kb = tl.load(ks_ptr + off, mask=ok[:, None] & dm[None, :], other=0.0)
            vb = tl.load(vs_ptr + off, mask=ok[:, None] & dm[None, :], other=0.0)
            sc = tl.dot(q, tl.trans(kb.to(tl.float32)), input_precision=PREC) * scale
            sc = tl.where(ok[None, :], sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)  # noqa: E741
            acc = acc * alpha[:, None] + tl.dot(p, vb.to(tl.float32), input_precision=PREC)
            m = m_new
        out = ((r * HKV + g) * SPLITS + s) * GP + heads  # partials (R, Hkv, SPLITS, GP)
        tl.store(m_ptr + out, m)
        tl.store(l_ptr + out, l)
        tl.store(acc_ptr + out[:, None] * HDP + d[None, :], acc)

    @triton.jit
    def _combine(
        m_ptr, l_ptr, acc_ptr, o_ptr,
        s_oh, s_or,  # out (1, H, R, hd): head, row strides
        HKV: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr,
        SPLITS: tl.constexpr,
    ):  # fmt: skip
        r, h = tl.program_id(0), tl.program_id(1)
        g, j = h // GROUP, h % GROUP
        sp = tl.arange(0, SPLITS)
        d = tl.arange(0, HDP)
        # partials of (row r, kv head g) live at ((r * HKV + g) * SPLITS + s) * GP + j
        idx = ((r * HKV + g) * SPLITS + sp) * GP + j
        m = tl.load(m_ptr + idx)
        l = tl.load(l_ptr + idx)  # noqa: E741
        top = tl.max(m, 0)
        w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
        acc = tl.load(acc_ptr + idx[:, None] * HDP + d[None, :])
        o = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
        tl.store(o_ptr + h * s_oh + r * s_or + d, o.to(o_ptr.dtype.element_ty), mask=d < HD)

    @triton.jit
    def _fused(
        q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr, o_ptr,
        s_qh, s_qr, s_kh, s_kr, s_vh, s_vr,  # q (1, H, R, hd), new k, v (1, Hkv, R, hd): head and row strides
        s_slot, s_head, s_pos,  # layer store (slots, Hkv, max_len, hd): strides
        s_oh, s_or,  # out (1, H, R, hd)
        scale,
        T: tl.constexpr, TP: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, QP: tl.constexpr,
        HD: tl.constexpr, HDP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        b, g, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        slot = tl.load(slot_ptr + b)
        n = tl.load(pos_ptr + b * T + T - 1) + 1  # the request's last row sees keys 0..its pos
        per = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK_N) * BLOCK_N
        lo = s * per
        hi = tl.minimum(lo + per, n)
        d = tl.arange(0, HDP)
        dm = d < HD
        base = slot * s_slot + g * s_head
        # 1. the request's new rows whose positions fall in this program's chunk: K/V into the store. Every
        # new position lies in exactly one chunk, and only that chunk's program reads it (after the barrier)
        jj = tl.arange(0, TP)
        pw = tl.load(pos_ptr + b * T + jj, mask=jj < T, other=-1)
        wm = (jj < T) & (pw >= lo) & (pw < hi)
        src = (b * T + jj)[:, None]
        dst = base + pw[:, None] * s_pos + d[None, :]
        w2 = wm[:, None] & dm[None, :]
        tl.store(ks_ptr + dst, tl.load(k_ptr + g * s_kh + src * s_kr + d[None, :], mask=w2), mask=w2)
        tl.store(vs_ptr + dst, tl.load(v_ptr + g * s_vh + src * s_vr + d[None, :], mask=w2), mask=w2)
        tl.debug_barrier()
        # 2. this chunk's keys for all GROUP heads x T rows of the request at once (query qi: head qi // TP,
        # row qi % TP), each row only up to its own position (the verify's causal mask)
        qi = tl.arange(0, QP)
        hh, tt = qi // TP, qi % TP
        live = (hh < GROUP) & (tt < T)
        row = b * T + tt
        head = g * GROUP + hh
        lim = tl.load(pos_ptr + row, mask=live, other=-1)
        q = tl.load(
            q_ptr + head[:, None] * s_qh + row[:, None] * s_qr + d[None, :], mask=live[:, None] & dm[None, :], other=0.0
        ).to(tl.float32)
        m = tl.full([QP], float("-inf"), tl.float32)
        l = tl.zeros([QP], tl.float32)  # noqa: E741
        acc = tl.zeros([QP, HDP], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            ok = keys < hi
            off = base + keys[:, None] * s_pos + d[None, :]
            kb = tl.load(ks_ptr + off, mask=ok[:, None] & dm[None, :], other=0.0)
            vb = tl.load(vs_ptr + off, mask=ok[:, None] & dm[None, :], other=0.0)
            sc = tl.dot(q, tl.trans(kb.to(tl.float32)), input_precision=PREC) * scale
            sc = tl.where(ok[None, :] & (keys[None, :] <= lim[:, None]), sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key here yet: no NaN
            alpha = tl.exp(m - m_ref)
            p = tl.exp(sc - m_ref[:, None])
            l = l * alpha + tl.sum(p, 1)  # noqa: E741
            acc = acc * alpha[:, None] + tl.dot(p, vb.to(tl.float32), input_precision=PREC)
            m = m_new
        part = ((b * HKV + g) * SPLITS + s) * QP + qi  # partials (B, Hkv, SPLITS, QP)
        tl.store(m_ptr + part, m)
        tl.store(l_ptr + part, l)
        tl.store(acc_ptr + part[:, None] * HDP + d[None, :], acc)
        # 3. the last of the SPLITS programs of (b, g) to finish merges the partials (a counter per (b, g),
        # back to 0 after: nothing to clear between replays). The barrier before the counter orders every
        # thread's stores before its release; the one after it, the merge's loads after its acquire
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + b * HKV + g, 1, sem="acq_rel", scope="gpu")
        if done == SPLITS - 1:
            tl.debug_barrier()
            first = ((b * HKV + g) * SPLITS) * QP
            sp = tl.arange(0, SPLITS)
            ms = tl.load(m_ptr + first + sp[:, None] * QP + qi[None, :], cache_modifier=".cg")  # (SPLITS, QP)
            top = tl.max(ms, 0)
            top = tl.where(top == float("-inf"), 0.0, top)
            num = tl.zeros([QP, HDP], tl.float32)
            den = tl.zeros([QP], tl.float32)
            for j in range(SPLITS):
                mj = tl.load(m_ptr + first + j * QP + qi, cache_modifier=".cg")
                w = tl.where(mj > float("-inf"), tl.exp(mj - top), 0.0)
                den += w * tl.load(l_ptr + first + j * QP + qi, cache_modifier=".cg")
                aj = tl.load(acc_ptr + (first + j * QP + qi)[:, None] * HDP + d[None, :], cache_modifier=".cg")
                num += aj * w[:, None]
            o = num / tl.where(den > 0, den, 1.0)[:, None]
            tl.store(
                o_ptr + head[:, None] * s_oh + row[:, None] * s_or + d[None, :],
                o.to(o_ptr.dtype.element_ty),
                mask=live[:, None] & dm[None, :],
            )
            tl.atomic_xchg(cnt_ptr + b * HKV + g, 0, sem="relaxed", scope="gpu")


def attend_slots(q, k, v, k_store, v_store, layer: int, slot_ids, pos, t: int) -> torch.Tensor:
    """q (1, H, R, hd), k/v (1, Hkv, R, hd) with R = B rows x t tokens; the stores (layers, slots, Hkv,
    max_len, hd); slot_ids (B,), pos (R,) -> (1, H, R, hd): the rows' K/V written at (slot, pos), each
    query over keys 0..pos of its row's slot."""
    kl, vl = k_store[layer], v_store[layer]
    nh, r, hd = q.shape[1], q.shape[2], q.shape[3]
    nkv = k.shape[1]
    group = nh // nkv
    gp = max(16, triton.next_power_of_2(group))  # tl.dot needs 16 rows
    hdp = triton.next_power_of_2(hd)
    # strided views as they come (q/k from RoPE, v a slice of the projection): only the head dim must be
    # contiguous, which a copy ensures where it is not (three copies a layer cost 200 us of an 8B step)
    q, k, v = (x if x.stride(3) == 1 else x.contiguous() for x in (q, k, v))
    assert kl.is_contiguous() and vl.stride() == kl.stride()
    _write[(r, nkv)](
        k, v, kl, vl, slot_ids, pos, k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        kl.stride(0), kl.stride(1), kl.stride(2), T=t, HD=hd, HDP=hdp,
    )  # fmt: skip
    # partials (R, Hkv, SPLITS, GP): max, sum and weighted values of each program's chunk
    m = torch.empty(r * nkv * SPLITS * gp, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)  # noqa: E741
    acc = torch.empty(r * nkv * SPLITS * gp, hdp, device=q.device, dtype=torch.float32)
    _attend[(r, nkv, SPLITS)](
        q, kl, vl, slot_ids, pos, m, l, acc,
        q.stride(1), q.stride(2), kl.stride(0), kl.stride(1), kl.stride(2), hd**-0.5,
        T=t, HKV=nkv, GROUP=group, GP=gp, HD=hd, HDP=hdp, SPLITS=SPLITS, BLOCK_N=BLOCK_N,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",  # tf32 holds a bf16/fp16 input exactly
    )  # fmt: skip
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    _combine[(r, nh)](
        m, l, acc, out, out.stride(1), out.stride(2), HKV=nkv, GROUP=group, GP=gp, HD=hd, HDP=hdp, SPLITS=SPLITS
    )
    return out


_COUNTERS: dict[torch.device, torch.Tensor] = {}  # attend_slots1's per-(request, kv head) counters


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters, one buffer per device, kept (each launch leaves them at 0 again). Made on the
    first (eager) call: a CUDA graph's capture would record a zeroing into every replay."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("attend_slots1: its counters must exist before a CUDA graph capture (run it once)")
        buf = _COUNTERS[device] = torch.zeros(max(n, 1024), device=device, dtype=torch.int32)
    return buf


def attend_slots1(q, k, v, k_store, v_store, layer: int, slot_ids, pos, t: int) -> torch.Tensor:
    """``attend_slots`` in one kernel a layer instead of three: each program of (request, kv head, key
    chunk) writes the request's new K/V that fall in its chunk, attends all of the request's t rows x
    the group's query heads over its chunk at once (each row up to its own position), and the last program
    of a (request, kv head) to finish merges the chunks (a counter). Same arguments and result."""
    kl, vl = k_store[layer], v_store[layer]
    nh, r, hd = q.shape[1], q.shape[2], q.shape[3]
    nkv = k.shape[1]
    group, b = nh // nkv, r // t
    tp = triton.next_power_of_2(t)
    qp = max(16, triton.next_power_of_2(group) * tp)  # tl.dot needs 16 rows
    hdp = triton.next_power_of_2(hd)
    q, k, v = (x if x.stride(3) == 1 else x.contiguous() for x in (q, k, v))
    assert kl.is_contiguous() and vl.stride() == kl.stride()
    m = torch.empty(b * nkv * SPLITS * qp, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)  # noqa: E741
    acc = torch.empty(b * nkv * SPLITS * qp, hdp, device=q.device, dtype=torch.float32)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    _fused[(b, nkv, SPLITS)](
        q, k, v, kl, vl, slot_ids, pos, m, l, acc, _counters(q.device, b * nkv), out,
        q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        kl.stride(0), kl.stride(1), kl.stride(2), out.stride(1), out.stride(2), hd**-0.5,
        T=t, TP=tp, HKV=nkv, GROUP=group, QP=qp, HD=hd, HDP=hdp, SPLITS=SPLITS, BLOCK_N=BLOCK_N,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out


# An operator that torch.compile leaves whole (it writes the stores in place), as kvcache's attend_rows.
@torch.library.custom_op("spec_decode::attend_slots", mutates_args=("k_store", "v_store"))
def _attend_slots_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
    layer: int,
    slot_ids: torch.Tensor,
    pos: torch.Tensor,
    t: int,
) -> torch.Tensor:
    return attend_slots(q, k, v, k_store, v_store, layer, slot_ids, pos, t)


@_attend_slots_op.register_fake
def _(q, k, v, k_store, v_store, layer, slot_ids, pos, t):
    return torch.empty(q.shape, device=q.device, dtype=q.dtype)


@torch.library.custom_op("spec_decode::attend_slots1", mutates_args=("k_store", "v_store"))
def _attend_slots1_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
    layer: int,
    slot_ids: torch.Tensor,
    pos: torch.Tensor,
    t: int,
) -> torch.Tensor:
    return attend_slots1(q, k, v, k_store, v_store, layer, slot_ids, pos, t)


@_attend_slots1_op.register_fake
def _(q, k, v, k_store, v_store, layer, slot_ids, pos, t):
    return torch.empty(q.shape, device=q.device, dtype=q.dtype)
