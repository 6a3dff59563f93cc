"""The projections of a few rows in Triton: a split-K GEMV over the engine's own weight layouts, set beside
cuBLAS by ``real_shape.py --gemm-micro`` (issue 31). Measured on the H200 (2026-12-02) it did not beat
cuBLAS on any of the 8B shape's projections (docs/embedded-engine.md, "A Triton GEMV"), and a decode step
with it in the engine (its four projections as one custom operator each) took 5.55 against 4.67 ms: it
stays a benchmark, not an engine path.

At a decode step's one row (a verify's k + 1), a projection is a read of its weight: cuBLAS ran the
8B shape's q/k/v at 3.1 TB/s whatever the layout, o at 2.6 and down at 3.7 (gate/up at 4.2), against
the H200's ~4.3 TB/s of reads (benchmarks/gpu/real_shape.py --gemm-micro, 2026-12-01), and its split-K
GEMMs add a reduce kernel each. Here: y (T, N) = x (T, K) @ W with T <= ``MAX_ROWS``, W read once in
[BLOCK_K, BLOCK_N] tiles (its columns contiguous, as the engine stores them), K cut into ``split_k``
chunks whose fp32 partials a second kernel sums in a fixed order (skipped at split_k 1). W is one (K, N)
matrix (o/down: the per-unit weights viewed as units stacked along the input) or per-unit matrices
(n, K, c) side by side (q/k/v, gate/up: column j of y is unit j // c's column j % c), read in place.

``config_for``: the config an engine would take, a fixed function of (K, N, c) and the SM count (no
timing at start-up, so the sums' order and rounding would be the same in every run).
"""

from __future__ import annotations

import torch

try:  # Triton comes with CUDA builds of torch; a CPU machine has none and never takes this path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None

MAX_ROWS = 16  # tl.dot's smallest M: rows are padded to it (masked), so T <= 16 costs one read of W


def config_for(k: int, n: int, c: int, sms: int) -> tuple[int, int, int, int, int]:
    """(block_k, block_n, split_k, stages, warps) for x (T, k) @ W (k, n) with units of c columns: 128 x
    128 tiles (block_n the largest of 128, 64, 32, 16 that divides c); K split until the programs fill
    every SM twice, each chunk keeping >= 2 tiles of K."""
    bn = next((b for b in (128, 64, 32) if c % b == 0), 16)
    bk, split = 128, 1
    while (n // bn) * split < 2 * sms and split < 16 and k // (2 * split) >= 2 * bk:
        split *= 2
    return bk, bn, split, 3, 4


if triton is not None:

    @triton.jit
    def _gemv(
        x_ptr, w_ptr, p_ptr, T, K, N, C, s_unit, s_row,
        TP: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr,
    ):  # fmt: skip
        pn, pk = tl.program_id(0), tl.program_id(1)
        cols = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        unit = (pn * BLOCK_N) // C  # a column block lies in one unit (BLOCK_N divides C)
        col = cols - unit * C
        rows = tl.arange(0, TP)
        chunk = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
        k_lo = pk * chunk
        acc = tl.zeros([TP, BLOCK_N], tl.float32)
        for k0 in tl.range(k_lo, tl.minimum(k_lo + chunk, K), BLOCK_K, num_stages=STAGES):
            ks = k0 + tl.arange(0, BLOCK_K)
            kin = ks < K
            w = tl.load(
                w_ptr + unit * s_unit + ks[:, None] * s_row + col[None, :],
                mask=kin[:, None],
                other=0.0,
                eviction_policy="evict_first",  # read once: leave L2 to x and the partials
            )
            xk = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < T) & kin[None, :], other=0.0)
            acc += tl.dot(xk, w)
        if SPLIT_K == 1:  # p is y itself (T, N)
            tl.store(p_ptr + rows[:, None] * N + cols[None, :], acc.to(p_ptr.dtype.element_ty), mask=rows[:, None] < T)
        else:
            tl.store(p_ptr + (pk * TP + rows[:, None]) * N + cols[None, :], acc, mask=rows[:, None] < T)

    @triton.jit
    def _sum_splits(p_ptr, y_ptr, T, N, TP: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat (row, col) of y
        live = i < T * N
        acc = tl.zeros([BLOCK], tl.float32)
        for s in tl.static_range(SPLIT_K):  # a fixed order: the same sum in every run
            acc += tl.load(p_ptr + s * TP * N + i, mask=live, other=0.0)
        tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=live)


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x (T, K) @ w: w (K, N), or (n, K, c) per-unit matrices side by side (N = n * c) -> (T, N) in x's
    dtype. ``config`` (block_k, block_n, split_k, stages, warps), default ``config_for`` the shape."""
    t, k = x.shape
    if w.dim() == 3:
        n, kw, c = w.shape
        s_unit, s_row, ncols = w.stride(0), w.stride(1), n * c
    else:
        kw, c = w.shape
        s_unit, s_row, ncols = 0, w.stride(0), c
    if config is None:
        config = config_for(k, ncols, c, torch.cuda.get_device_properties(w.device).multi_processor_count)
    block_k, block_n, split_k, stages, warps = config
    if kw != k or w.stride(-1) != 1 or not x.is_contiguous() or c % block_n or t > MAX_ROWS:
        raise ValueError(
            f"gemv: x {tuple(x.shape)} (contiguous {x.is_contiguous()}) @ w {tuple(w.shape)} (strides "
            f"{w.stride()}) with block_n {block_n}: needs K to match, columns contiguous, c % block_n == 0 "
            f"and T <= {MAX_ROWS}"
        )
    y = torch.empty(t, ncols, device=x.device, dtype=x.dtype)
    parts = y if split_k == 1 else torch.empty(split_k, MAX_ROWS, ncols, device=x.device, dtype=torch.float32)
    _gemv[(ncols // block_n, split_k)](
        x, w, parts, t, k, ncols, c, s_unit, s_row,
        TP=MAX_ROWS, BLOCK_K=block_k, BLOCK_N=block_n, SPLIT_K=split_k, STAGES=stages, num_warps=warps,
    )  # fmt: skip
    if split_k > 1:
        block = 1024
        _sum_splits[(triton.cdiv(t * ncols, block),)](parts, y, t, ncols, TP=MAX_ROWS, SPLIT_K=split_k, BLOCK=block)
    return y
