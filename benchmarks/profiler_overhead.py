"""Overhead of the profiler plugin's timer on a real decoding workload, and that it changes no output.

    python benchmarks/profiler_overhead.py                 # CPU: host clock
    python benchmarks/profiler_overhead.py --device cuda   # GPU: CUDA events, resolved later

The embedded engine's decoder has SGLang's phase methods (cycle / draft / verify / extend); the plugin's
PhaseTimer wraps them with the same AROUND hooks it registers on EAGLEWorkerV2 / EagleDraftWorker.
Variants run interleaved (AB BA AB ...); overhead = median over rounds of (tok/s without / with - 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.embedded.tokenizer import encode
from spec_decode.parsers.profile import phase_summary, rank_path, read_profile
from spec_decode.profiler.plugin import make_timer

ROOT = Path(__file__).resolve().parents[1]


def hooked(dec: Decoder, path: str) -> Decoder:
    timer = make_timer(path, rank=0)  # after the models are on the device: CUDA events there
    for name in ("draft", "verify", "extend"):
        orig = getattr(dec, name)
        setattr(dec, name, (lambda o, h: lambda *a, **k: h(o, *a, **k))(orig, timer.phase(name)))
    orig_cycle = dec.cycle
    dec.cycle = lambda *a, **k: timer.around_cycle(orig_cycle, *a, **k)
    dec._timer = timer
    return dec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(ROOT / "models/tiny/target", args.device)
    drafter = load_drafter(ROOT / "models/tiny/drafter", target, args.device)
    prompt = encode(json.loads((ROOT / "data/prompts.jsonl").read_text().splitlines()[0])["text"])
    tmp = Path(tempfile.mkdtemp(prefix="prof_"))
    plain = Decoder(target, drafter, args.steps)
    timed = hooked(Decoder(target, drafter, args.steps), str(tmp / "profile.jsonl"))
    for d in (plain, timed):
        d.generate(prompt, 64)
    res = {"plain": [], "hooked": []}
    outs = {}
    for i in range(args.rounds):
        order = (("plain", plain), ("hooked", timed))
        for name, d in (order if i % 2 == 0 else order[::-1]):  # ABBA: no order advantage
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            g = d.generate(prompt, args.tokens)
            if args.device == "cuda":
                torch.cuda.synchronize()
            res[name].append(args.tokens / (time.perf_counter() - t0))
            outs[name] = g.output_ids
    timed._timer.close()
    cycles = read_profile(Path(rank_path(tmp / "profile.jsonl", 0)))
    summ = phase_summary(cycles)
    over = statistics.median(p / h - 1 for p, h in zip(res["plain"], res["hooked"]))
    print(f"device={args.device} threads={args.threads} steps={args.steps} tokens={args.tokens} "
          f"rounds={args.rounds} clock={type(timed._timer.clock).__name__} torch={torch.__version__}")
    print("| variant | tok/s (median) |")
    print("|---|---|")
    for k, v in res.items():
        print(f"| {k} | {statistics.median(v):.1f} |")
    print(f"timer overhead: {100 * over:+.2f}% of throughput (median of per-round ratios); "
          f"outputs identical: {outs['plain'] == outs['hooked']}")
    print(f"profile: {summ['cycles']} cycles, cycle {summ['cycle_ms']:.3f} ms = draft {summ['draft_ms']:.3f} + "
          f"verify {summ['verify_ms']:.3f} + re-extend {summ['extend_ms']:.3f} + other {summ['other_ms']:.3f}; "
          f"accept len {summ['accept_len']:.2f}")


if __name__ == "__main__":
    main()
