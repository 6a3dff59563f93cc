"""A cycle's host operations on the static path, before and after issue 41's fifth session, on one GPU.

    timeout 300 python benchmarks/gpu/draft_chain.py --steps 3,5 --rounds 15 --prompts 4 --json /tmp/draft_chain.json
    python benchmarks/gpu/draft_chain.py --device cpu --steps 3 --rounds 2 --tokens 32   # a CPU check

On the tiny model a cycle costs what the host takes to issue it, and a slow state was seen in which the
host's code ran ~2x slower for minutes (docs/gpu-session-2026-12-04.md), so every host operation a cycle
issues is exposed. Three variants of ``graphs.StaticRunner``, the two older ones kept only in this file:

- ``now``: the draft chain as one shape (one graph, as SGLang's EAGLEDraftCudaGraphRunner), the verify's
  and draft's positions and the verify's commit to the slots' lengths inside their shapes, the re-extend
  reading the verify's buffers in place (static_shapes.py; ~14 non-view ATen ops a cycle outside the
  shapes, tests/integration/test_static_host_ops.py);
- ``stepwise``: the same, but the draft's one-step shape replayed k-1 times, the host copying each step's
  token, hidden state and position into the next replay's buffers (f0978a6's parent);
- ``hostglue``: the stepwise draft, and the host computing the verify's positions, committing its counts
  and copying the verify's predictions, features, positions and last indices into the re-extend's own
  buffers (the cycle before this session: 31+ ops a cycle at steps 3, more at 5).

All run in this one process on the same models, built first, then timed in interleaved rounds (the order
rotating round by round): per round and step count, each variant generates ``--tokens`` greedy tokens
for each of ``--prompts`` prompts alone (``Decoder.generate``, the overlap loop on: the server's
default). Prints per variant the median tok/s and ms per cycle over the rounds, its speedup over
``hostglue`` as the median of per-round ratios with a 95% interval over rounds (``stats.paired_ratio``),
and whether its outputs equal hostglue's (they must: the same kernels). The intervals hold the rounds'
noise within this process, not launch-to-launch.
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
        bufs["pos"] = torch.zeros(b, dtype=torch.long, device=self.device)

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
        b["pos"].copy_(self._starts(b))  # the drafter's length is the target's at a cycle's start
        for _ in range(self.k - 1):
            out = self.run(name)
            drafts.append(out["next"][:n, 0].clone())
            b["tok"][0].copy_(out["next"][:, 0])
            b["h"].copy_(out["h_out"])
            b["pos"].add_(1)
        for c in caches:
            c.length += self.k - 1
        return torch.stack(drafts, dim=1)


class HostGlueRunner(StepwiseRunner):
    """The whole cycle as it was before issue 41's fifth session: the stepwise draft, and the host
    computing the verify's positions, committing its counts to the slots' lengths, and copying the
    verify's predictions, features, positions and last indices into the re-extend's own buffers."""

    def _add_bucket(self, b: int) -> None:
        super()._add_bucket(b)
        if self.drafter is None:
            return
        t, v = self.k + 1, self.bufs[f"verify@{b}"]
        own = {key: torch.zeros_like(v[key]) for key in ("pos", "aux")}
        own |= {"ids": torch.zeros_like(v["ids"]), "last": torch.zeros(b, dtype=torch.long, device=self.device)}
        own |= {"first": torch.zeros(b, dtype=torch.long, device=self.device)}
        own["h_out"] = self.bufs[f"extend@{b}"]["h_out"]
        self._add(f"extend@{b}", b, t, own, self._old_extend)

    def _verify(self, b) -> None:  # no positions, no lengths: the host does both
        logits, aux = self.target.forward_static(
            b["ids"], b["pos"], b["trows"], self.capture_ids, rot_rows=not self.compile, dense=self.compile
        )
        pred = logits.argmax(-1).view(b["pred"].shape)
        b["pred"].copy_(pred)
        b["accepted"].copy_(
            (b["ids"].view(b["pred"].shape)[:, 1:] == pred[:, : self.k]).to(torch.int32).cumprod(1).sum(1)
        )
        b["aux"].copy_(aux)

    def _old_extend(self, b) -> None:
        dl, dh = self.drafter.forward_static(b["ids"], b["aux"], b["pos"], b["drows"], rot_rows=not self.compile)
        b["first"].copy_(self.drafter.to_target_ids(dl.index_select(0, b["last"]).argmax(-1)))
        b["h_out"].copy_(dh.index_select(1, b["last"]))

    def verify(self, caches, lasts, drafts, accept=None):
        n, t = len(caches), self.k + 1
        b, name, size = self._rows("verify", caches)
        ids = b["ids"].view(size, t)
        ids[:n, 0].copy_(lasts)
        ids[:n, 1:].copy_(drafts)
        b["pos"].view(-1, t).copy_(self._starts(b)[:, None] + self.arange[:t])
        out = self.run(name)
        real = self.arange[:size] < n
        if accept is None:
            rows = torch.where(real, out["accepted"], 0)
        else:
            rows = torch.tensor(list(accept) + [0] * (size - n), dtype=torch.long).to(self.device, non_blocking=True)
        for c, a in zip(caches, accept if accept is not None else [None] * n):
            c.length += t if a is None else a + 1
        self.tlen.index_add_(0, b["slots"], torch.where(real, rows + 1, 0))
        self.last_verify = (name, size, rows)
        aux = out["aux"].view(size, t, -1)[:n]
        return (rows[:n] if accept is None else list(accept)), out["pred"][:n].clone(), aux

    def extend(self, caches, preds=None):
        n, t = len(caches), self.k + 1
        vname, size, rows = self.last_verify
        v = self.bufs[vname]
        b, name, _ = self._rows("extend", caches)
        b["ids"].copy_(v["pred"].view(1, -1))
        if preds is not None:
            b["ids"].view(size, t)[:n].copy_(preds)
        b["aux"].copy_(v["aux"])
        b["pos"].copy_(v["pos"])
        b["last"].copy_(self.arange[:size] * t + rows)
        out = self.run(name)
        return out["first"][:n].clone(), out["h_out"][:, :n].clone()


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
    print("| steps | variant | tok/s (median) | ms per cycle | / hostglue [95% CI] | outputs equal hostglue's |")
    print("|---|---|---|---|---|---|")
    runners = {"now": StaticRunner, "stepwise": StepwiseRunner, "hostglue": HostGlueRunner}
    for k in map(int, args.steps.split(",")):
        decs = {
            name: Decoder(target, drafter, k, cls(target, drafter, k, use_graphs=graphs))
            for name, cls in runners.items()
        }
        for dec in decs.values():  # warm each (allocator, first replays)
            timed(dec, prompts[:1], 32)
        res = {name: {"tok_s": [], "ms": [], "outs": None} for name in decs}
        names = list(decs)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # the order rotates round by round
                tok_s, ms, outs = timed(decs[name], prompts, args.tokens)
                res[name]["tok_s"].append(tok_s)
                res[name]["ms"].append(ms)
                res[name]["outs"] = outs
        ref = res["hostglue"]
        for name in decs:
            row = {
                "steps": k,
                "variant": name,
                "tok_s": res[name]["tok_s"],
                "ms_per_cycle": res[name]["ms"],
                "median_tok_s": statistics.median(res[name]["tok_s"]),
                "median_ms_per_cycle": statistics.median(res[name]["ms"]),
                "outputs_equal": res[name]["outs"] == ref["outs"],
            }
            cell = "-"
            if name != "hostglue":
                ratio = paired_ratio(res[name]["tok_s"], ref["tok_s"])
                per_round = [a / b for a, b in zip(res[name]["tok_s"], ref["tok_s"])]
                row |= {"ratio_median": statistics.median(per_round), "ratio_ci": [ratio.ci95_lo, ratio.ci95_hi]}
                cell = f"{row['ratio_median']:.3f} [{ratio.ci95_lo:.3f}, {ratio.ci95_hi:.3f}]"
            rows.append(row)
            print(
                f"| {k} | {name} | {row['median_tok_s']:.1f} | {row['median_ms_per_cycle']:.3f} | {cell} | "
                f"{row['outputs_equal']} |"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
