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


@dataclass
class _State:
    """The decoding state carried between cycles."""

    tcache: object
    dcache: object
    last: torch.Tensor | None = None  # committed, not yet in the target cache
    first: torch.Tensor | None = None  # the next cycle's first draft token
    h_last: torch.Tensor | None = None  # the drafter hidden state that produced it
    committed: list = field(default_factory=list)


@dataclass
class CycleOut:
    accepted_drafts: int
    accept_lens: list[int]  # per request, incl. the bonus token (as SGLang's batch result)
    timing: Cycle | None


class Clock:
    """Host clock; on CUDA it synchronises at phase boundaries so host times mean device times.
    (The SGLang plugin uses CUDA events instead; here one request owns the device.)"""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def _no_clock() -> float:
    return 0.0


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

    def cycle(self, st: _State) -> CycleOut:
        """One speculative cycle (SGLang: EAGLEWorkerV2.forward_batch_generation for a decode batch)."""
        clock = self.clock if self.profile else _no_clock  # the CUDA clock synchronises: only when asked
        t0 = clock()
        base = st.tcache.length
        draft = self.draft(st.first, st.h_last, st.dcache)
        t1 = clock()
        a, pred, aux = self.verify(st.last, draft, st.tcache)
        t2 = clock()
        new = pred[: a + 1]  # accepted drafts (== pred[:a]) and the bonus token
        st.first, st.h_last = self.extend(new, aux[:, : a + 1], st.dcache, base)
        st.last = new[-1:]
        st.committed.append(new)
        t3 = clock()
        timing = None
        if self.profile:
            timing = Cycle(time.time(), (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3, a + 1)
        return CycleOut(a, [a + 1], timing)

    # The three phases as methods (the shape of SGLang's EagleDraftWorker.draft / EAGLEWorkerV2.verify /
    # _draft_extend_for_decode), so that phase hooks such as the profiler plugin's can wrap them.
    def draft(self, first: torch.Tensor, h: torch.Tensor, dcache) -> torch.Tensor:
        """k draft tokens: the first from the last re-extend, then k-1 drafter steps on its own hidden."""
        drafter = self.drafter
        drafts, tok = [first], first
        for _ in range(self.steps - 1):
            dl, h = drafter(tok.view(1, 1), h, dcache)
            tok = drafter.to_target_ids(dl[-1].argmax()).view(1)
            drafts.append(tok)
        return torch.cat(drafts)

    def verify(self, last: torch.Tensor, draft: torch.Tensor, tcache):
        """One target forward over [last, d1..dk]; returns (accepted count, argmax preds, features)."""
        base = tcache.length
        logits, aux = self.target(torch.cat([last, draft]).view(1, -1), tcache, self.capture)
        pred = logits.argmax(-1)  # (k+1,)
        a = int((draft == pred[: self.steps]).to(torch.int32).cumprod(0).sum())
        tcache.crop(base + a + 1)
        return a, pred, aux

    def extend(self, new: torch.Tensor, feats: torch.Tensor, dcache, base: int):
        """Drop the chain's own entries, re-extend with the true features of the committed tokens;
        returns the next cycle's first draft token and hidden state."""
        dcache.crop(base)
        dl, dh = self.drafter(new.view(1, -1), feats, dcache)
        return self.drafter.to_target_ids(dl[-1].argmax()).view(1), dh[:, -1:]

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
        target, drafter, k = self.target, self.drafter, self.steps
        assert drafter is not None
        st = _State(tcache=target.new_cache(), dcache=drafter.new_cache())
        # Prefill: target over the prompt; the drafter extends over it pairing feature t with token t+1.
        logits, aux = target(ids, st.tcache, self.capture)
        st.last = logits[-1].argmax().view(1)
        dlogits, dh = drafter(torch.cat([ids[0, 1:], st.last]).view(1, -1), aux, st.dcache)
        st.first = drafter.to_target_ids(dlogits[-1].argmax()).view(1)
        st.h_last = dh[:, -1:]
        st.committed = [st.last]
        produced = 1
        gen = Generation(output_ids=[], prompt_tokens=ids.shape[1], histogram=[0] * (k + 1))
        while produced < n:
            out = self.cycle(st)
            a = out.accepted_drafts
            produced += a + 1
            gen.verify_ct += 1
            gen.correct_drafts += a
            gen.histogram[a] += 1
            if out.timing is not None:
                gen.cycles.append(out.timing)
            if on_step is not None:
                on_step(a + 1, a)
        gen.proposed_drafts = gen.verify_ct * k
        gen.decode_steps = gen.verify_ct
        gen.output_ids = torch.cat(st.committed)[:n].tolist()
        return gen
