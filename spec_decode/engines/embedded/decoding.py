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

**Forced acceptance** (``SGLANG_SIMULATE_ACC_LEN``, SGLang 0.5.23's benchmark knob, same semantics:
``sglang/srt/speculative/spec_utils.py`` ``sample_simulated_acc_len`` / ``generate_simulated_accept_index``,
applied in ``eagle_utils.py`` after verification): each verify draws how many tokens it commits,
bonus included, and commits exactly that many whatever the target says. Outputs are then not
lossless: performance work only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.model import Eagle3Drafter, LlamaTarget


@dataclass
class Generation:
    output_ids: list[int]
    prompt_tokens: int
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = field(default_factory=list)  # histogram[a] = cycles that accepted a drafts
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
    on_tokens: object = None  # a streamed request's sender: called with each cycle's committed ids


@dataclass
class CycleOut:
    accepted_drafts: int
    accept_lens: list[int]  # per request, incl. the bonus token (as SGLang's batch result); the
    # profiler plugin reads this attribute from the return value of its AROUND hook on ``cycle``


FILL_TOKEN = 100  # SGLang's token mode "fixed": every committed token is id 100 ("some legit token id")
SIMULATE_METHODS = ("match-expected", "multinomial")
SIMULATE_TOKEN_MODES = ("fixed", "real-draft-token")


class ForcedAcceptance:
    """SGLang 0.5.23's simulated acceptance for one verify of a batch-1 chain of ``steps`` drafts.

    ``draw()`` gives the tokens this verify commits, in 1..steps+1 (bonus included), from
    ``accept_len`` (SGLANG_SIMULATE_ACC_LEN) by ``method`` (SGLANG_SIMULATE_ACC_METHOD):

    - ``match-expected`` (SGLang's default): ``floor(x)`` or ``floor(x) + 1``, the upper with probability
      ``x - floor(x)``, so the mean is x (x clamped to [1, steps+1] first);
    - ``multinomial``: ``round(clamp(N(x, 1), 1, steps+1))`` (its mean drifts from x near the bounds).

    ``apply(draft, pred, n)`` rewrites the target's argmax predictions so that the first n are what the
    verify commits (``token_mode``, SGLANG_SIMULATE_ACC_TOKEN_MODE): ``fixed`` (SGLang's default) fills
    every position with token id 100; ``real-draft-token`` commits the first n-1 draft tokens and the
    target's prediction after them as the bonus. The draws come from this object's own generator,
    seeded with the server's --random-seed: every rank draws the same sequence (SGLang draws from the
    seeded global torch generator of each rank)."""

    def __init__(self, accept_len: float, steps: int, method: str = "match-expected",
                 token_mode: str = "fixed", seed: int = 0):
        if not (math.isfinite(accept_len) and accept_len > 0):
            raise ValueError(f"SGLANG_SIMULATE_ACC_LEN={accept_len}: must be a number > 0")
        if method not in SIMULATE_METHODS:
            raise ValueError(f"SGLANG_SIMULATE_ACC_METHOD={method!r}: expected one of {', '.join(SIMULATE_METHODS)}")
        if token_mode not in SIMULATE_TOKEN_MODES:
            raise ValueError(f"SGLANG_SIMULATE_ACC_TOKEN_MODE={token_mode!r}: expected 'fixed' or 'real-draft-token'")
        self.accept_len, self.steps, self.method, self.token_mode = accept_len, steps, method, token_mode
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    @classmethod
    def from_env(cls, steps: int, seed: int, env=os.environ) -> ForcedAcceptance | None:
        """None unless SGLANG_SIMULATE_ACC_LEN is set > 0 (SGLang: "turn off if < 0"; default -1)."""
        raw = env.get("SGLANG_SIMULATE_ACC_LEN", "").strip()
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"SGLANG_SIMULATE_ACC_LEN={raw!r}: not a number") from None
        if not value > 0:
            return None
        return cls(value, steps, env.get("SGLANG_SIMULATE_ACC_METHOD", "match-expected"),
                   env.get("SGLANG_SIMULATE_ACC_TOKEN_MODE", "fixed"), seed)

    def describe(self) -> str:
        return (f"forced acceptance: SGLANG_SIMULATE_ACC_LEN={self.accept_len} method={self.method} "
                f"token_mode={self.token_mode} (performance-only: outputs are not lossless)")

    def draw(self) -> int:
        top = self.steps + 1
        if self.method == "multinomial":
            x = torch.normal(self.accept_len, 1.0, size=(1,), generator=self.generator)
            return int(torch.clamp(x, 1.0, top).round().item())
        x = max(1.0, min(top, self.accept_len))
        lower = int(x // 1)
        if lower >= top:
            return top
        upper_p = x - lower
        probs = torch.tensor([1.0 - upper_p, upper_p])
        return lower + int(torch.multinomial(probs, 1, generator=self.generator).item())

    def apply(self, draft: torch.Tensor, pred: torch.Tensor, n: int) -> torch.Tensor:
        """The predictions with the first n replaced by what this verify commits (a new tensor)."""
        pred = pred.clone()
        if self.token_mode == "fixed":
            pred.fill_(FILL_TOKEN)
        elif n > 1:
            pred[: n - 1] = draft[: n - 1]  # pred[n - 1], the target's next token after them, is the bonus
        return pred


def max_new_tokens(context: int, steps: int, prompt_len: int) -> int:
    """The longest generation that fits the context (the last cycle may overshoot by steps + 1)."""
    return context - prompt_len - steps - 1


class Decoder:
    """Greedy decoding of one request at a time. In a tensor-parallel server every rank runs its own
    Decoder in lockstep: the target's row-parallel blocks all-reduce inside its forward; the drafter
    and all decisions (argmax, accepted count) are replicated and come out equal on every rank.

    ``cycle``, ``draft``, ``verify`` and ``extend`` are the profiler plugin's hook targets (it patches
    these class attributes): keep their names and call them as attributes of ``self``.

    With a ``runner`` (the CUDA path, graphs.py) the phases run on static buffers -- CUDA-graph
    replays unless graphs are disabled; the cycle's logic stays here, unchanged."""

    def __init__(self, target: LlamaTarget, drafter: Eagle3Drafter | None, steps: int,
                 runner: StaticRunner | None = None, forced: ForcedAcceptance | None = None):
        self.target = target
        self.drafter = drafter
        self.steps = steps if drafter is not None else 0
        self.capture = list(drafter.shape.aux_layer_ids) if drafter is not None else None
        self.device = target.lm_head.weight.device
        self.context = target.shape.max_position_embeddings
        self.runner = runner
        # Forced acceptance (SGLANG_SIMULATE_ACC_LEN): speculative decoding only, as in SGLang.
        self.forced = forced if drafter is not None else None

    @property
    def cuda_graph(self) -> bool:
        return self.runner is not None and self.runner.use_graphs

    def max_new_tokens(self, prompt_len: int) -> int:
        return max_new_tokens(self.context, self.steps, prompt_len)

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, on_step=None, on_tokens=None) -> Generation:
        """``on_step(tokens, accepted)`` after each decode step / verify cycle (counters);
        ``on_tokens(ids)`` with the token ids committed by the prefill and then by each step (a
        device tensor, possibly past ``max_new_tokens`` in the last cycle): what a stream sends."""
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        if self.drafter is None:
            return self._greedy(ids, max_new_tokens, on_step, on_tokens)
        return self._speculative(ids, max_new_tokens, on_step, on_tokens)

    def cycle(self, st: _State) -> CycleOut:
        """One speculative cycle (SGLang: EAGLEWorkerV2.forward_batch_generation for a decode batch)."""
        base = st.tcache.length
        draft = self.draft(st.first, st.h_last, st.dcache)
        a, pred, aux = self.verify(st.last, draft, st.tcache)
        new = pred[: a + 1]  # accepted drafts (== pred[:a]) and the bonus token
        st.first, st.h_last = self.extend(new, aux[:, : a + 1], st.dcache, base)
        st.last = new[-1:]
        st.committed.append(new)
        if st.on_tokens is not None:  # a streamed request: the send is part of the cycle (its `other`
            st.on_tokens(new)  # phase), not loop time between cycles that the profile cannot see
        return CycleOut(a, [a + 1])

    # The three phases as methods (the shape of SGLang's EagleDraftWorker.draft / EAGLEWorkerV2.verify /
    # _draft_extend_for_decode), so that phase hooks such as the profiler plugin's can wrap them.
    def draft(self, first: torch.Tensor, h: torch.Tensor, dcache) -> torch.Tensor:
        """k draft tokens: the first from the last re-extend, then k-1 drafter steps on its own hidden."""
        if self.runner is not None:
            return self.runner.draft(first, h)
        drafter = self.drafter
        drafts, tok = [first], first
        for _ in range(self.steps - 1):
            dl, h = drafter(tok.view(1, 1), h, dcache)
            tok = drafter.to_target_ids(dl[-1].argmax()).view(1)
            drafts.append(tok)
        return torch.cat(drafts)

    def verify(self, last: torch.Tensor, draft: torch.Tensor, tcache):
        """One target forward over [last, d1..dk]; returns (accepted count, argmax preds, features).
        With forced acceptance the count is drawn instead and the preds rewritten (SGLang's order:
        the real verification runs, then the simulation overrides its result)."""
        forced = self.forced.draw() - 1 if self.forced is not None else None
        if self.runner is not None:
            a, pred, aux = self.runner.verify(last, draft, accept=forced)
        else:
            base = tcache.length
            logits, aux = self.target(torch.cat([last, draft]).view(1, -1), tcache, self.capture)
            pred = logits.argmax(-1)  # (k+1,)
            a = int((draft == pred[: self.steps]).to(torch.int32).cumprod(0).sum())
            if forced is not None:
                a = forced
            tcache.crop(base + a + 1)
        if forced is not None:
            pred = self.forced.apply(draft, pred, a + 1)
        return a, pred, aux

    def extend(self, new: torch.Tensor, feats: torch.Tensor, dcache, base: int):
        """Drop the chain's own entries, re-extend with the true features of the committed tokens;
        returns the next cycle's first draft token and hidden state."""
        if self.runner is not None:
            return self.runner.extend(new, feats, base)
        dcache.crop(base)
        dl, dh = self.drafter(new.view(1, -1), feats, dcache)
        return self.drafter.to_target_ids(dl[-1].argmax()).view(1), dh[:, -1:]

    def _greedy(self, ids: torch.Tensor, n: int, on_step, on_tokens) -> Generation:
        runner = self.runner
        if runner is not None:
            runner.new_caches()
            logits, _ = runner.prefill(ids)
        else:
            cache = self.target.new_cache()
            logits, _ = self.target(ids, cache)
        tok = logits[-1].argmax().view(1, 1)
        out = [tok]
        if on_tokens is not None:
            on_tokens(tok.view(1))
        gen = Generation(output_ids=[], prompt_tokens=ids.shape[1])
        while len(out) < n:
            if runner is not None:
                tok = runner.decode(tok)
            else:
                logits, _ = self.target(tok, cache)
                tok = logits[-1].argmax().view(1, 1)
            out.append(tok)
            gen.decode_steps += 1
            if on_step is not None:
                on_step(1, None)
            if on_tokens is not None:
                on_tokens(tok.view(1))
        gen.output_ids = torch.cat(out, dim=1)[0, :n].tolist()
        return gen

    def _speculative(self, ids: torch.Tensor, n: int, on_step, on_tokens) -> Generation:
        target, drafter, k = self.target, self.drafter, self.steps
        assert drafter is not None
        runner = self.runner
        if runner is not None:
            tcache, dcache = runner.new_caches()
            st = _State(tcache=tcache, dcache=dcache)
        else:
            st = _State(tcache=target.new_cache(), dcache=drafter.new_cache())
        # Prefill: target over the prompt; the drafter extends over it pairing feature t with token t+1.
        logits, aux = runner.prefill(ids) if runner is not None else target(ids, st.tcache, self.capture)
        st.last = logits[-1].argmax().view(1)
        shifted = torch.cat([ids[0, 1:], st.last]).view(1, -1)
        dlogits, dh = (runner.prefill_drafter(shifted, aux) if runner is not None
                       else drafter(shifted, aux, st.dcache))
        st.first = drafter.to_target_ids(dlogits[-1].argmax()).view(1)
        st.h_last = dh[:, -1:]
        st.committed = [st.last]
        st.on_tokens = on_tokens
        if on_tokens is not None:
            on_tokens(st.last)
        produced = 1
        gen = Generation(output_ids=[], prompt_tokens=ids.shape[1], histogram=[0] * (k + 1))
        while produced < n:
            out = self.cycle(st)
            a = out.accepted_drafts
            produced += a + 1
            gen.verify_ct += 1
            gen.correct_drafts += a
            gen.histogram[a] += 1
            if on_step is not None:
                on_step(a + 1, a)
        gen.proposed_drafts = gen.verify_ct * k
        gen.decode_steps = gen.verify_ct
        gen.output_ids = torch.cat(st.committed)[:n].tolist()
        return gen
