"""Can a layer's o_proj weights be read into L2 while its attention runs (issue 31)? A question for one
GPU call, before anything of it goes into the engine.

    timeout 200 python benchmarks/gpu/l2_prefetch.py            # CUDA + Triton

On the 8B shape o_proj (4096 x 4096 bf16, 33.5 MB) takes 13.1 us a layer at T = 1, 2.6 TB/s: a GEMM that
small is bound by its start and tail, not by HBM. Attention runs just before it (~7-9 us a layer with
slot_attention's kernels) and reads little: HBM is idle then. The H200's L2 is 50 MB. If a kernel on a
second stream reads the o weight during attention, and the GEMM then finds it in L2, a layer saves up to
the GEMM's HBM time, unless the reader slows the attention more.

Per layer, 32 layers (each its own weight and K/V store layer, so that L2 serves nothing across layers)
captured in one CUDA graph, GPU us per layer:

- ``attn``: slot attention alone (batch 1, 8 kv heads x 4 query heads, head dim 128, position ``--pos``);
- ``gemm``: x @ W_o alone; ``gemm_l2``: the GEMM right after a read of its W (what L2 gives at best);
- ``read`` (P programs): the reader alone;
- ``serial``: attention then the GEMM (the engine today);
- ``overlap`` (P): the reader of W_o on a second stream beside the attention, joined before the GEMM.

Measured 2026-12-02 (H200, docs/embedded-engine.md, seventh GPU session): attn 7.37, gemm 13.06, serial
21.49, gemm_l2 29.35 with read(132) 18.66 alone (L2 saves ~2.4 us of the GEMM at best); every overlap
width slower than serial (28.4-134 us). Not pursued.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_profile import capture, gpu_us  # noqa: E402  (benchmarks/gpu is scripts, not a package)

from spec_decode.engines.embedded import slot_attention  # noqa: E402


@triton.jit
def _read(w_ptr, out_ptr, n, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program p reads elements [p * CHUNK, (p + 1) * CHUNK) of w in BLOCK steps and stores one sum (so
    that the loads stay): the lines pass through L2 on their way."""
    p = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, CHUNK, BLOCK):
        offs = p * CHUNK + i + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + p, tl.sum(acc, 0))


def read(w: torch.Tensor, out: torch.Tensor, programs: int) -> None:
    n = w.numel()
    block = 4096
    chunk = triton.cdiv(triton.cdiv(n, programs), block) * block
    _read[(programs,)](w, out, n, CHUNK=chunk, BLOCK=block, num_warps=8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--pos", type=int, default=300)
    ap.add_argument("--programs", default="16,33,66,132,264")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("l2_prefetch.py: needs a CUDA device; none here", file=sys.stderr)
        return 2
    dev, bf = "cuda", torch.bfloat16
    L, h, nh, nkv, hd, max_len = args.layers, 4096, 32, 8, 128, 2048
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(h, h, device=dev, dtype=bf, generator=g) / 64 for _ in range(L)]
    x = torch.randn(1, h, device=dev, dtype=bf, generator=g)
    ks = torch.randn(L, 2, nkv, max_len, hd, device=dev, dtype=bf, generator=g)
    vs = torch.randn_like(ks)
    q = torch.randn(1, nh, 1, hd, device=dev, dtype=bf, generator=g)
    k = torch.randn(1, nkv, 1, hd, device=dev, dtype=bf, generator=g)
    v = torch.randn_like(k)
    slot = torch.tensor([0], device=dev)
    pos = torch.tensor([args.pos], device=dev)
    sums = torch.empty(1024, device=dev, dtype=torch.float32)
    side = torch.cuda.Stream()

    def attn(i):
        return slot_attention.attend_slots(q, k, v, ks, vs, i, slot, pos, 1)

    def layers(body):
        def run():
            for i in range(L):
                body(i)

        return run

    def overlap(p):
        def body(i):
            cur = torch.cuda.current_stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                read(ws[i], sums, p)
            attn(i)
            cur.wait_stream(side)
            x @ ws[i]

        return body

    variants = {
        "attn": lambda i: attn(i),
        "gemm": lambda i: x @ ws[i],
        "gemm_l2": lambda i: (read(ws[i], sums, 132), x @ ws[i]),
        "serial": lambda i: (attn(i), x @ ws[i]),
    }
    for p in [int(v) for v in args.programs.split(",")]:
        variants[f"read({p})"] = lambda i, p=p: read(ws[i], sums, p)
        variants[f"overlap({p})"] = overlap(p)
    graphs = {name: capture(layers(body)) for name, body in variants.items()}
    us = {name: [] for name in graphs}
    for _ in range(3):  # interleaved rounds
        for name, graph in graphs.items():
            us[name].append(gpu_us(graph.replay)[0] / L)
    print(f"us per layer (median of 3 interleaved rounds; {L} layers, position {args.pos}, o_proj 33.5 MB):")
    for name, vals in us.items():
        m = sorted(vals)[1]
        print(f"  {name:14s} {m:8.2f}   {[round(v, 2) for v in vals]}")
    serial = sorted(us["serial"])[1]
    best = min((sorted(v)[1], n) for n, v in us.items() if n.startswith("overlap"))
    print(f"serial {serial:.2f} us, best overlap {best[0]:.2f} us ({best[1]}): {serial - best[0]:+.2f} us a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
