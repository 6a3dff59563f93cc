"""A split-K GEMV in Triton for the decode step's projections (issue 31), to set beside cuBLAS in
``real_shape.py --gemm-micro`` before anything of it goes into the engine.

On the 8B shape cuBLAS ran q/k/v at 3.1 TB/s whatever the layout, o at 2.6 and down at 3.7 (gate/up at
4.2), and its split-K GEMMs add a reduce kernel each (110 us a step). Here: y (T, N) = x (T, K) @ W with
T <= 16 rows, W read once in [BLOCK_K, BLOCK_N] tiles (columns contiguous), K cut into SPLIT_K chunks
whose fp32 partials a second kernel sums (skipped at SPLIT_K 1). W is either one (K, N) matrix (o/down
in the units-stacked view) or per-unit matrices (n, K, c) side by side (q/k/v, gate/up: column j of the
product is unit j // c's column j % c), addressed in place; BLOCK_N must divide c.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
        w = tl.load(w_ptr + unit * s_unit + ks[:, None] * s_row + col[None, :], mask=kin[:, None], other=0.0)
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
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(p_ptr + s * TP * N + i, mask=live, other=0.0)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=live)


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    block_k: int = 128,
    block_n: int = 128,
    split_k: int = 4,
    stages: int = 3,
    warps: int = 4,
) -> torch.Tensor:
    """x (T, K) @ w: w (K, N), or (n, K, c) per-unit matrices side by side (N = n * c) -> (T, N)."""
    t, k = x.shape
    if w.dim() == 3:
        n, kw, c = w.shape
        s_unit, s_row, ncols = w.stride(0), w.stride(1), n * c
    else:
        kw, c = w.shape
        s_unit, s_row, ncols = 0, w.stride(0), c
    assert kw == k and w.stride(-1) == 1 and x.is_contiguous() and c % block_n == 0 and t <= 16
    tp = 16  # tl.dot's smallest M
    y = torch.empty(t, ncols, device=x.device, dtype=x.dtype)
    parts = y if split_k == 1 else torch.empty(split_k, tp, ncols, device=x.device, dtype=torch.float32)
    _gemv[(ncols // block_n, split_k)](
        x, w, parts, t, k, ncols, c, s_unit, s_row,
        TP=tp, BLOCK_K=block_k, BLOCK_N=block_n, SPLIT_K=split_k, STAGES=stages, num_warps=warps,
    )  # fmt: skip
    if split_k == 1:
        return y
    block = 1024
    _sum_splits[(triton.cdiv(t * ncols, block),)](parts, y, t, ncols, TP=tp, SPLIT_K=split_k, BLOCK=block)
    return y


CONFIGS = [  # (block_k, block_n, split_k, stages, warps): a small sweep, the best kept per shape
    (128, 128, 1, 3, 4),
    (128, 128, 2, 3, 4),
    (128, 128, 4, 3, 4),
    (128, 128, 8, 3, 4),
    (64, 128, 4, 4, 4),
    (256, 64, 4, 3, 4),
    (128, 256, 4, 3, 8),
    (128, 64, 8, 4, 4),
]
