"""Why a decode graph with slot_attention's Triton kernels cost more wall time than its GPU time (issue 31).

    timeout 300 python benchmarks/gpu/graph_launch.py

On the 8B shape (2026-12-01, call 2) the compiled decode graph with "slots" attention took 4866 us of GPU
time and 5.43 ms a step, while the graph with SDPA took 5129 us and 5.27 ms; 200 back-to-back replays
cost 3140 us of host time each against 7 us. Each variant below is 32 calls (a decode step's layers) of
one layer's attention at batch 1 captured in one graph; printed per replay: GPU us (CUDA events over
back-to-back replays), host us of those replays, and the wall of one replay followed by a
synchronize (median of 200), against the same for an empty graph.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_profile import capture, gpu_us  # noqa: E402

from spec_decode.engines.embedded import slot_attention  # noqa: E402
from spec_decode.engines.embedded.kvcache import StaticKVCache, attend_rows  # noqa: E402

LAYERS, NH, NKV, HD, MAX_LEN, POS = 32, 32, 8, 128, 2048, 300


def sync_wall_us(g: torch.cuda.CUDAGraph, n: int = 200) -> float:
    walls = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(walls)


if slot_attention.triton is not None:
    tl = slot_attention.tl

    @slot_attention.triton.jit
    def _touch(x_ptr):
        tl.store(x_ptr + tl.program_id(0), tl.load(x_ptr + tl.program_id(0)) + 1)


def main() -> int:
    dev, bf = "cuda", torch.bfloat16
    c = StaticKVCache(LAYERS, NKV, MAX_LEN, HD, device=dev, dtype=bf, slots=2)
    q = torch.randn(1, NH, 1, HD, device=dev, dtype=bf)
    k = torch.randn(1, NKV, 1, HD, device=dev, dtype=bf)
    v = torch.randn_like(k)
    slot, pos = torch.zeros(1, dtype=torch.long, device=dev), torch.full((1,), POS, dtype=torch.long, device=dev)
    rows = c.rows(slot, 1)
    mask = rows.mask(pos)
    c2 = StaticKVCache(LAYERS, NKV, MAX_LEN, HD, device=dev, dtype=bf, slots=2)
    c2.prepare_graph_ops("slots")
    x = torch.zeros(64, device=dev)
    variants = {
        "empty (one tiny ATen kernel)": lambda: x.add_(1),
        "sdpa path: index_copy x2, gather x2, SDPA": lambda: [
            attend_rows(q, k, v, c.k, c.v, i, rows._where, slot, mask, 1, False) for i in range(LAYERS)
        ],
        "slots: _write, _attend, _combine (Triton)": lambda: [
            slot_attention.attend_slots(q, k, v, c2.k, c2.v, i, slot, pos, 1) for i in range(LAYERS)
        ],
        "one tiny Triton kernel x 96": lambda: [_touch[(1,)](x) for _ in range(3 * LAYERS)],
        "one tiny ATen kernel x 96": lambda: [x.add_(1) for _ in range(3 * LAYERS)],
    }
    print(f"{'variant':45s} {'GPU us':>9s} {'host us':>9s} {'replay+sync us':>15s}")
    for name, fn in variants.items():
        g = capture(fn)
        gpu, host = gpu_us(g.replay)
        print(f"{name:45s} {gpu:9.1f} {host:9.1f} {sync_wall_us(g):15.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
