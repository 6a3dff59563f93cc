"""Does StaticRunner._put wait for the GPU? Pageable against pinned host values (issue 31).

    timeout 300 python benchmarks/gpu/put_sync.py            # CUDA only; the 8B pair generated if missing

1. The copy alone: a 100 ms GPU sleep queued, then one _put of 4 positions; host ms until _put returns
   (a copy that waits for the stream returns after the sleep), pageable then pinned, 3 times each.
2. The cycle: the 8B-shaped pair (tp 1, compiled static path, forced accept 2.0 at steps 1, real-draft
   tokens), ``runner.pin_puts`` off and on interleaved over ``--repeats`` on the same runner: cycle ms =
   (wall of a long generation - a short one) / their verify difference, as real_shape.py; and the GPU
   time of one cycle's graphs (verify + re-extend) for the gap.

Measured 2026-12-02 (H200, docs/embedded-engine.md, seventh GPU session): the pageable copy returns in
0.16-0.19 ms with 100 ms queued (no wait for the stream), pinned 0.26-0.28 ms; the cycle 5.435 (pageable)
against 5.589 ms (pinned): pinned / pageable 1.028. ``pin_puts`` stays off.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_profile import gpu_us  # noqa: E402  (benchmarks/gpu is scripts, not a package)
from real_shape import PROMPT, ROOT, load_pair, timed  # noqa: E402

from spec_decode.engines.embedded import synthetic  # noqa: E402
from spec_decode.engines.embedded.decoding import Decoder, ForcedAcceptance  # noqa: E402
from spec_decode.engines.embedded.graphs import StaticRunner  # noqa: E402


def copy_alone(runner) -> dict:
    buf = runner.bufs["verify@1"]["pos"]
    out = {}
    for pinned in (False, True, False, True, False, True):
        runner.pin_puts = pinned
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~100 ms of GPU cycles queued
        t0 = time.perf_counter()
        runner._put(buf, [1, 2, 3, 4][: buf.numel()])
        ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        out.setdefault("pinned" if pinned else "pageable", []).append(round(ms, 3))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--short", type=int, default=40)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("put_sync.py: needs a CUDA device (it compares host-to-GPU copies); none here", file=sys.stderr)
        return 2
    for line in synthetic.ensure("llama31_8b_shape", "llama31_8b_shape_eagle3", "cuda", root=ROOT):
        print(line, flush=True)
    with torch.no_grad():
        target, drafter = load_pair("llama31_8b_shape", "llama31_8b_shape_eagle3", "cuda")
        runner = StaticRunner(target, drafter, 1, use_graphs=True, compile=True)
        print(f"host ms until _put returns, 100 ms of GPU work queued: {copy_alone(runner)}", flush=True)
        forced = ForcedAcceptance(2.0, 1, token_mode="real-draft-token", seed=0)
        decoder = Decoder(target, drafter, 1, runner, forced)
        ids = list(PROMPT)
        decoder.generate(ids, args.short, overlap=True)
        cycles = {"pageable": [], "pinned": []}
        for _ in range(args.repeats):
            for mode in cycles:
                runner.pin_puts = mode == "pinned"
                (w0, g0), (w1, g1) = (timed(decoder, ids, n, "cuda", forced, True) for n in (args.short, args.tokens))
                cycles[mode].append((w1 - w0) / (g1.verify_ct - g0.verify_ct) * 1e3)
        graphs = gpu_us(runner.graphs["verify@1"].replay)[0] + gpu_us(runner.graphs["extend@1"].replay)[0]
    for mode, c in cycles.items():
        med = statistics.median(c)
        print(
            f"steps 1, accept 2.0, {mode:8s}: cycle {med:.3f} ms (runs {[round(x, 3) for x in c]}), "
            f"graphs {graphs / 1e3:.3f} ms, host gap {med - graphs / 1e3:.3f} ms",
            flush=True,
        )
    ratio = statistics.median(cycles["pinned"]) / statistics.median(cycles["pageable"])
    print(f"pinned / pageable cycle: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
