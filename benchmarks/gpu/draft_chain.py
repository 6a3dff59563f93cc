"""The draft chain as one CUDA graph against one replay per draft step (issue 41's slow state).

    timeout 300 python benchmarks/gpu/draft_chain.py --steps 3,5 --rounds 7 --json /tmp/draft_chain.json
    python benchmarks/gpu/draft_chain.py --device cpu --steps 3 --rounds 2 --tokens 32   # a CPU check

The static path's ``draft`` shape runs a cycle's k-1 drafter steps in one function, captured as one graph
(``graphs.StaticRunner``, as SGLang's EAGLEDraftCudaGraphRunner). Before, the host replayed a one-step
graph k-1 times with four small copies after each (the ``stepwise`` variant here, kept only in this
file). On the tiny model a cycle costs what the host takes to issue it, and a slow state was seen in
which the host issues ~2x slower for seconds (docs/gpu-session-2026-12-04.md), so fewer host operations
per cycle should matter there.

Both variants run in this one process on the same models, built first, then timed in interleaved rounds
(the order alternating round by round): per round and step count, each variant generates ``--tokens``
greedy tokens for each of ``--prompts`` prompts alone (``Decoder.generate``, the overlap loop on: the
server's default). Prints per variant the median tok/s and per-cycle ms over the rounds, the speedup of
the chain over stepwise as the median of per-round ratios and a 95% interval over rounds
(``stats.paired_ratio``), and whether every output equals the stepwise variant's (they must: same
kernels, same order). The intervals hold the rounds' noise within this process, not launch-to-launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from spec_decode.analysis.stats import paired_ratio
from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.embedded.tokenizer import encode

ROOT = Path(__file__).resolve().parents[2]


class StepwiseRunner(StaticRunner):
    """The draft as it was before the chain: a one-step shape replayed k-1 times, the host copying each
    step's token, hidden state and position into the next replay's buffers."""

    def _add_bucket(self, b: int) -> None:
        super()._add_bucket(b)
        if self.drafter is None or self.k == 1:
            return
        bufs = self.bufs[f"draft@{b}"]
        bufs["next"] = torch.zeros(b, 1, dtype=torch.long, device=self.device)
        bufs["h_out"] = torch.zeros_like(bufs["h"])

    def _draft(self, b) -> None:
        dl, h = self.drafter.forward_static(b["tok"], b["h"], b["pos"], b["drows"], rot_rows=not self.compile)
        b["next"][:, 0].copy_(self.drafter.to_target_ids(dl.argmax(-1)))
        b["h_out"].copy_(h)

    def draft(self, caches, firsts, h):
        n = len(caches)
        if self.k == 1:
            return firsts.view(n, 1)
        b, name, _ = self._rows("draft", caches)
        drafts = [firsts]
        b["tok"][0, :n].copy_(firsts)
        b["h"][:, :n].copy_(h)
        self._device_positions(b, 1)
        for _ in range(self.k - 1):
            out = self.run(name)
            drafts.append(out["next"][:n, 0].clone())
            b["tok"][0].copy_(out["next"][:, 0])
            b["h"].copy_(out["h_out"])
            b["pos"].add_(1)
        for c in caches:
            c.length += self.k - 1
        return torch.stack(drafts, dim=1)


def timed(dec: Decoder, prompts: list[list[int]], tokens: int) -> tuple[float, float, list[list[int]]]:
    """(tok/s, ms per cycle, outputs) for the prompts one after another."""
    outs, cycles = [], 0
    if dec.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for ids in prompts:
        g = dec.generate(ids, tokens, overlap=True)
        outs.append(g.output_ids)
        cycles += g.verify_ct
    wall = time.perf_counter() - t0
    return len(prompts) * tokens / wall, wall / max(cycles, 1) * 1e3, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", default="3,5")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = (ROOT / "data/prompts.jsonl").read_text().splitlines()[: args.prompts]
    prompts = [encode(json.loads(line)["text"]) for line in lines]
    target = load_target(ROOT / "models/tiny/target", args.device)
    drafter = load_drafter(ROOT / "models/tiny/drafter", target, args.device)
    graphs = args.device == "cuda"
    rows = []
    print(f"torch {torch.__version__}, device {args.device}, {len(prompts)} prompts x {args.tokens} tokens")
    print("| steps | variant | tok/s (median) | ms per cycle | chain / stepwise [95% CI] | outputs equal |")
    print("|---|---|---|---|---|---|")
    for k in map(int, args.steps.split(",")):
        decs = {
            "chain": Decoder(target, drafter, k, StaticRunner(target, drafter, k, use_graphs=graphs)),
            "stepwise": Decoder(target, drafter, k, StepwiseRunner(target, drafter, k, use_graphs=graphs)),
        }
        timed(decs["chain"], prompts[:1], 32)  # warm both (allocator, first replays)
        timed(decs["stepwise"], prompts[:1], 32)
        res = {name: {"tok_s": [], "ms": [], "outs": None} for name in decs}
        for r in range(args.rounds):
            for name in list(decs)[:: 1 if r % 2 == 0 else -1]:
                tok_s, ms, outs = timed(decs[name], prompts, args.tokens)
                res[name]["tok_s"].append(tok_s)
                res[name]["ms"].append(ms)
                res[name]["outs"] = outs
        ratio = paired_ratio(res["chain"]["tok_s"], res["stepwise"]["tok_s"])
        equal = res["chain"]["outs"] == res["stepwise"]["outs"]
        for name in decs:
            row = {
                "steps": k,
                "variant": name,
                "tok_s": res[name]["tok_s"],
                "ms_per_cycle": res[name]["ms"],
                "median_tok_s": statistics.median(res[name]["tok_s"]),
                "median_ms_per_cycle": statistics.median(res[name]["ms"]),
            }
            cell = "-"
            if name == "chain":
                per_round = [a / b for a, b in zip(res["chain"]["tok_s"], res["stepwise"]["tok_s"])]
                row |= {"ratio_median": statistics.median(per_round), "ratio_ci": [ratio.ci95_lo, ratio.ci95_hi]}
                cell = f"{row['ratio_median']:.3f} [{ratio.ci95_lo:.3f}, {ratio.ci95_hi:.3f}]"
            rows.append(row)
            print(f"| {k} | {name} | {row['median_tok_s']:.1f} | {row['median_ms_per_cycle']:.3f} | {cell} | {equal} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
