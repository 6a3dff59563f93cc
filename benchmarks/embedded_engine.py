"""Embedded engine: baseline vs EAGLE-3 steps 1, 2, 3, 5 on the default prompt, interleaved.

    python benchmarks/embedded_engine.py                 # CPU, 1 thread (the engine's default)
    python benchmarks/embedded_engine.py --device cuda   # on a GPU (bf16 is not used: fp32 everywhere)

Each round runs every variant once (ABCDE ABCDE ...), so machine noise hits all of them alike; the
table gives medians over rounds, the speedup as the median of per-round ratios, and the phase split
(ms per cycle) of the speculative variants. In process, no HTTP: the engine's own speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.embedded.tokenizer import encode

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", default="1,2,3,5")
    ap.add_argument("--drafter", default=str(ROOT / "models/tiny/drafter"))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(ROOT / "models/tiny/target", args.device)
    drafter = load_drafter(args.drafter, target, args.device)
    prompt = encode(json.loads((ROOT / "data/prompts.jsonl").read_text().splitlines()[0])["text"])
    # On CUDA the phase clock synchronises at every phase boundary: time throughput without it and
    # take the phase split from one extra profiled generation per variant.
    profile_inline = args.device != "cuda"
    variants = {"baseline": Decoder(target, None, 0, profile=False)}
    variants |= {f"steps={k}": Decoder(target, drafter, int(k), profile=profile_inline)
                 for k in args.steps.split(",")}
    for dec in variants.values():  # warmup
        dec.generate(prompt, 64)
    tps: dict[str, list[float]] = {k: [] for k in variants}
    last = {}
    for _ in range(args.rounds):
        for name, dec in variants.items():
            t0 = time.perf_counter()
            gen = dec.generate(prompt, args.tokens)
            if args.device == "cuda":
                torch.cuda.synchronize()
            tps[name].append(args.tokens / (time.perf_counter() - t0))
            last[name] = gen
    if not profile_inline:
        for name, dec in variants.items():
            if dec.drafter is not None:
                last[name] = Decoder(target, drafter, dec.steps, profile=True).generate(prompt, args.tokens)
    base = tps["baseline"]
    ref = last["baseline"].output_ids
    print(f"device={args.device} threads={args.threads} tokens={args.tokens} rounds={args.rounds} "
          f"torch={torch.__version__}")
    head = "| variant | tok/s (median) | speedup (median of per-round ratios) | accept len | draft accept rate | " \
           "cycle ms | draft ms | verify ms | re-extend ms | lossless |"
    print(head)
    print("|---" * 10 + "|")
    rows = []
    for name, vals in tps.items():
        gen = last[name]
        ratio = statistics.median(v / b for v, b in zip(vals, base))
        row = {"variant": name, "tok_s": statistics.median(vals), "speedup": ratio,
               "lossless": gen.output_ids == ref}
        if gen.cycles:
            row |= {
                "accept_len": len(gen.output_ids) / gen.verify_ct,
                "accept_rate": gen.correct_drafts / gen.proposed_drafts,
                **{f"{p}_ms": statistics.fmean(getattr(c, f"{p}_ms") for c in gen.cycles)
                   for p in ("cycle", "draft", "verify", "extend")},
            }
        rows.append(row)
        f = lambda k, spec=".2f", row=row: format(row[k], spec) if k in row else "-"  # noqa: E731
        print(f"| {name} | {row['tok_s']:.0f} | {ratio:.2f}x | {f('accept_len')} | {f('accept_rate')} | "
              f"{f('cycle_ms')} | {f('draft_ms')} | {f('verify_ms')} | {f('extend_ms')} | {row['lossless']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
