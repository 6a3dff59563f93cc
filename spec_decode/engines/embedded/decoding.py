"""Greedy decoding, plain and with EAGLE-3 chain speculation (topk = 1), on our tiny models.

One speculative cycle, as in SGLang's EAGLEWorkerV2.forward_batch_generation:

- **draft**: the drafter proposes k tokens. The first came out of the previous re-extend; steps 2..k
  each run the drafter once on its own previous hidden state.
- **verify**: one target forward over ``[last, d1..dk]`` (k+1 tokens) with the KV cache. The accepted
  prefix is the drafts that equal the target's argmax; the target's next argmax is the bonus token.
  The target cache is cropped to drop the rejected positions.
- **re-extend**: the drafter cache is cropped back to the committed length (dropping the chain
  entries made from its own hidden states) and re-extended with the target's *true* features of the
  accepted positions; its last position yields the next cycle's first draft token.

Greedy verification makes the output equal plain greedy decoding of the target whatever the drafter
does, so a bad drafter (e.g. served with the wrong layer ids) shows only as low acceptance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .model import Eagle3Drafter, LlamaTarget


@dataclass
class Cycle:
    """One speculative cycle's timings (ms) and how many tokens it committed."""

    t: float
    draft_ms: float
    verify_ms: float
    extend_ms: float
    cycle_ms: float
    accepted: int

    def as_json(self) -> dict:
        return {
            "t": round(self.t, 6), "draft_ms": round(self.draft_ms, 4),
            "verify_ms": round(self.verify_ms, 4), "extend_ms": round(self.extend_ms, 4),
            "cycle_ms": round(self.cycle_ms, 4), "accepted": self.accepted,
        }


@dataclass
class Generation:
    output_ids: list[int]
    prompt_tokens: int
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = field(default_factory=list)  # histogram[a] = cycles that accepted a drafts
    cycles: list[Cycle] = field(default_factory=list)
    decode_steps: int = 0  # target forwards after prefill (verify cycles, or plain decode steps)


class Clock:
    """Host clock; on CUDA it synchronises at phase boundaries so host times mean device times.
    (The SGLang plugin uses CUDA events instead; here one request owns the device.)"""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class Decoder:
    def __init__(self, target: LlamaTarget, drafter: Eagle3Drafter | None, steps: int, profile: bool):
        self.target = target
        self.drafter = drafter
        self.steps = steps if drafter is not None else 0
        self.capture = list(drafter.shape.aux_layer_ids) if drafter is not None else None
        self.device = target.lm_head.weight.device
        self.clock = Clock(self.device)
        self.profile = profile
        self.context = target.shape.max_position_embeddings

    def max_new_tokens(self, prompt_len: int) -> int:
        """The longest generation that fits the context (the last cycle may overshoot by k+1)."""
        return self.context - prompt_len - self.steps - 1

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, on_step=None) -> Generation:
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        if self.drafter is None:
            return self._greedy(ids, max_new_tokens, on_step)
        return self._speculative(ids, max_new_tokens, on_step)

    def _greedy(self, ids: torch.Tensor, n: int, on_step) -> Generation:
        cache = self.target.new_cache()
        logits, _ = self.target(ids, cache)
        tok = logits[-1].argmax().view(1, 1)
        out = [tok]
        gen = Generation(output_ids=[], prompt_tokens=ids.shape[1])
        while len(out) < n:
            logits, _ = self.target(tok, cache)
            tok = logits[-1].argmax().view(1, 1)
            out.append(tok)
            gen.decode_steps += 1
            if on_step is not None:
                on_step(1, None)
        gen.output_ids = torch.cat(out, dim=1)[0, :n].tolist()
        return gen

    def _speculative(self, ids: torch.Tensor, n: int, on_step) -> Generation:
        target, drafter, k, clock = self.target, self.drafter, self.steps, self.clock
        assert drafter is not None
        tcache, dcache = target.new_cache(), drafter.new_cache()
        # Prefill: target over the prompt; the drafter extends over it pairing feature t with token t+1.
        logits, aux = target(ids, tcache, self.capture)
        last = logits[-1].argmax().view(1)
        dlogits, dh = drafter(torch.cat([ids[0, 1:], last]).view(1, -1), aux, dcache)
        first = drafter.to_target_ids(dlogits[-1].argmax()).view(1)
        h_last = dh[:, -1:]
        committed = [last]
        produced = 1
        gen = Generation(output_ids=[], prompt_tokens=ids.shape[1], histogram=[0] * (k + 1))
        while produced < n:
            t0 = clock()
            base = tcache.length
            drafts = [first]
            tok, h = first, h_last
            for _ in range(k - 1):
                dl, h = drafter(tok.view(1, 1), h, dcache)
                tok = drafter.to_target_ids(dl[-1].argmax()).view(1)
                drafts.append(tok)
            draft = torch.cat(drafts)
            t1 = clock()
            logits, aux = target(torch.cat([last, draft]).view(1, -1), tcache, self.capture)
            pred = logits.argmax(-1)  # (k+1,)
            a = int((draft == pred[:k]).to(torch.int32).cumprod(0).sum())
            tcache.crop(base + a + 1)
            t2 = clock()
            dcache.crop(base)
            new = pred[: a + 1]  # accepted drafts (== pred[:a]) and the bonus token
            dl, dh = drafter(new.view(1, -1), aux[:, : a + 1], dcache)
            first = drafter.to_target_ids(dl[-1].argmax()).view(1)
            h_last = dh[:, -1:]
            last = new[-1:]
            committed.append(new)
            produced += a + 1
            t3 = clock()
            gen.verify_ct += 1
            gen.correct_drafts += a
            gen.histogram[a] += 1
            if self.profile:
                gen.cycles.append(
                    Cycle(time.time(), (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3,
                          (t3 - t0) * 1e3, a + 1)
                )
            if on_step is not None:
                on_step(a + 1, a)
        gen.proposed_drafts = gen.verify_ct * k
        gen.decode_steps = gen.verify_ct
        gen.output_ids = torch.cat(committed)[:n].tolist()
        return gen
