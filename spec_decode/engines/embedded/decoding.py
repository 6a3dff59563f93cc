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

import os
from dataclasses import dataclass, field

import torch

from spec_decode.engines.embedded.batch import (
    BatchResult,
    Req,
    Rope,
    ScheduleBatch,
    drafter_forward,
    split_rows,
    target_forward,
)
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.kvcache import SlotCache
from spec_decode.engines.embedded.loop import BatchLoop
from spec_decode.engines.embedded.model import Eagle3Drafter, LlamaTarget
from spec_decode.engines.embedded.server_args import (  # noqa: F401 - SIMULATE_*: re-exported, their old home
    SIMULATE_METHODS,
    SIMULATE_TOKEN_MODES,
    SimulatedAcceptance,
    max_new_tokens,
)


@dataclass
class Generation:
    output_ids: list[int]
    prompt_tokens: int
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = field(default_factory=list)  # histogram[a] = cycles that accepted a drafts
    decode_steps: int = 0  # target forwards after prefill (verify cycles, or plain decode steps)
    inflight_cycles: int = 0  # overlap scheduler: cycles run after the result that finished it


FILL_TOKEN = 100  # SGLang's token mode "fixed": every committed token is id 100 ("some legit token id")


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
    seeded global torch generator of each rank). The settings and their rules are
    ``server_args.SimulatedAcceptance`` (torch-free: the front checks them before any rank starts)."""

    def __init__(
        self, accept_len: float, steps: int, method: str = "match-expected", token_mode: str = "fixed", seed: int = 0
    ):
        self.settings = SimulatedAcceptance(accept_len, method, token_mode)  # a bad value: ValueError
        self.accept_len, self.steps, self.method, self.token_mode = accept_len, steps, method, token_mode
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    @classmethod
    def from_env(cls, steps: int, seed: int, env=os.environ) -> ForcedAcceptance | None:
        """None unless SGLANG_SIMULATE_ACC_LEN is set > 0 (SGLang: "turn off if < 0"; default -1)."""
        settings = SimulatedAcceptance.from_env(env)
        if settings is None:
            return None
        return cls(settings.accept_len, steps, settings.method, settings.token_mode, seed)

    def describe(self) -> str:
        return self.settings.describe()

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


class Decoder:
    """Greedy decoding of a batch of requests, each with its own KV caches and its own accepted length
    per verify (ragged acceptance). In a tensor-parallel server every rank runs its own Decoder in
    lockstep: the target's row-parallel blocks all-reduce inside its forward; the drafter and all
    decisions (argmax, accepted counts) are replicated and come out equal on every rank.

    Hook contract (the profiler plugin patches these class attributes; keep the names and call them as
    attributes of ``self``): ``cycle(batch)`` is the whole cycle, SGLang's
    ``EAGLEWorkerV2.forward_batch_generation(batch)``: ``batch`` is a ``batch.ScheduleBatch`` (``.reqs``,
    each with ``.rid``; ``.forward_mode`` with ``is_decode()`` / ``is_extend()`` / ``is_idle()``); it
    returns a ``BatchResult`` whose ``accept_lens`` lists each request's committed tokens. A prefill
    (extend) batch goes through ``cycle`` too and calls no phase; a decode batch calls
    ``draft(batch)``, ``verify(batch, drafts)`` and ``extend(batch, news, feats)`` once each. The
    baseline (no drafter) never calls them (SGLang's non-speculative worker is not hooked either).

    With a ``runner`` (the static / CUDA path, graphs.py) the phases run on its static buffers, a batch
    of n requests in its bucket's shapes (CUDA-graph replays unless graphs are disabled; eager above
    the largest bucket); each request holds one of its slots from its prefill until ``release``
    (``max_batch``: the slots it has)."""

    def __init__(
        self,
        target: LlamaTarget,
        drafter: Eagle3Drafter | None,
        steps: int,
        runner: StaticRunner | None = None,
        forced: ForcedAcceptance | None = None,
    ):
        self.target = target
        self.drafter = drafter
        self.steps = steps if drafter is not None else 0
        self.capture = list(drafter.shape.aux_layer_ids) if drafter is not None else None
        self.device = target.lm_head.weight.device
        self.context = target.shape.max_position_embeddings
        self.runner = runner
        self.max_batch = runner.n_slots if runner is not None else None  # the static path's request slots
        # Forced acceptance (SGLANG_SIMULATE_ACC_LEN): speculative decoding only, as in SGLang.
        self.forced = forced if drafter is not None else None
        # Room for the overlap scheduler's in-flight cycle past the last committable position.
        self.margin = self.steps + 1
        self.trope = Rope(target, self.margin) if runner is None else None
        self.drope = Rope(drafter, self.margin) if runner is None and drafter is not None else None

    @property
    def cuda_graph(self) -> bool:
        return self.runner is not None and self.runner.use_graphs

    def replays_graphs(self, n: int) -> bool:
        """Whether a decode batch of ``n`` requests replays CUDA graphs (the decode log's ``cuda graph``)."""
        return self.runner is not None and self.runner.replays(n)

    def release(self, req: Req) -> None:
        """The request has left and no launched cycle holds it any more: its static slot is free."""
        if self.runner is not None and req.tcache is not None:
            self.runner.release(req.tcache)
            req.tcache = req.dcache = None

    def max_new_tokens(self, prompt_len: int) -> int:
        return max_new_tokens(self.context, self.steps, prompt_len)

    def new_req(self, rid: str, prompt: list[int], max_new: int, stream: bool = False) -> Req:
        return Req(
            rid=rid,
            origin_input_ids=list(prompt),
            max_new_tokens=max_new,
            stream=stream,
            histogram=[0] * (self.steps + 1) if self.drafter is not None else [],
        )

    def room_for_cycle(self, req: Req) -> bool:
        """Whether one more cycle fits the request's caches (always, but for the static path's
        in-flight cycle at the very end of the context: that one is skipped)."""
        return req.tcache.length + self.steps + 1 <= req.tcache.max_len

    @torch.inference_mode()
    def run_batch(self, batch: ScheduleBatch) -> BatchResult:
        if self.drafter is None:  # the baseline: no hooked method (as SGLang's non-spec worker)
            return self.prefill(batch) if batch.forward_mode.is_extend() else self.decode(batch)
        return self.cycle(batch)

    def generate(self, prompt: list[int], max_new_tokens: int, overlap: bool = False) -> Generation:
        """One request alone (batch size 1): the reference that any concurrency must reproduce."""
        req = self.new_req("0", prompt, max_new_tokens)
        loop = BatchLoop(self, max_running=1, overlap=overlap)
        loop.add(req)
        loop.run_until_idle()
        return generation(req, self.steps)

    # ---- the hooked cycle and its phases ----------------------------------------------------------
    def cycle(self, batch: ScheduleBatch) -> BatchResult:
        """One forward of the batch (SGLang: EAGLEWorkerV2.forward_batch_generation)."""
        if batch.forward_mode.is_extend():
            return self.prefill(batch)
        drafts = self.draft(batch)
        accepted, preds, aux = self.verify(batch, drafts)
        if isinstance(accepted, torch.Tensor):  # the static path, verified counts: they stay on the device
            firsts, h = self.extend(batch, preds, aux)
            lasts = preds.gather(1, accepted.view(-1, 1))  # each row's bonus token, the next cycle's input
            for i, req in enumerate(batch.reqs):
                req.last = lasts[i]
                req.first, req.h_last = firsts[i : i + 1], h[:, i : i + 1]
            return BatchResult(preds=preds, accepted=accepted, caches=[r.tcache for r in batch.reqs])
        news = [pred[: a + 1] for pred, a in zip(preds, accepted)]  # accepted drafts and the bonus
        feats = [x[:, : a + 1] for x, a in zip(aux, accepted)]
        firsts, h = self.extend(batch, news, feats)
        for i, req in enumerate(batch.reqs):
            req.last = news[i][-1:]
            req.first, req.h_last = firsts[i : i + 1], h[:, i : i + 1]
        return BatchResult(news, accepted)

    def draft(self, batch: ScheduleBatch) -> torch.Tensor:
        """(B, k) drafts: the first from the last re-extend, then k-1 drafter steps on its own hidden."""
        reqs = batch.reqs
        if self.runner is not None:
            h = torch.cat([r.h_last for r in reqs], dim=1) if len(reqs) > 1 else reqs[0].h_last
            return self.runner.draft([r.dcache for r in reqs], torch.cat([r.first for r in reqs]), h)
        toks = [r.first for r in reqs]
        drafts = [torch.cat(toks)]
        h = torch.cat([r.h_last for r in reqs], dim=1) if len(reqs) > 1 else reqs[0].h_last
        caches = [r.dcache for r in reqs]
        for _ in range(self.steps - 1):
            dl, h = drafter_forward(self.drafter, self.drope, toks, h, caches)
            tok = self.drafter.to_target_ids(dl.argmax(-1))
            drafts.append(tok)
            toks = list(tok.view(-1, 1))
        return torch.stack(drafts, dim=1)

    def verify(self, batch: ScheduleBatch, drafts: torch.Tensor):
        """One target forward over each request's [last, d1..dk]; returns per request (accepted count,
        argmax preds, features). With forced acceptance the counts are drawn (one per request, in
        batch order) and the preds rewritten (SGLang's order: the real verification runs first)."""
        reqs, k = batch.reqs, self.steps
        forced = [self.forced.draw() - 1 for _ in reqs] if self.forced is not None else None
        if self.runner is not None:
            accepted, pred, aux = self.runner.verify(
                [r.tcache for r in reqs], torch.cat([r.last for r in reqs]), drafts, accept=forced
            )
            if forced is None:  # the counts (n,) on the device, the preds (n, k+1): no host read
                return accepted, pred, aux
            preds, auxs = list(pred), list(aux[:, None])  # (k+1,) and (1, k+1, w) per request
        else:
            caches = [r.tcache for r in reqs]
            bases = [c.length for c in caches]
            ids = [torch.cat([r.last, drafts[i]]) for i, r in enumerate(reqs)]
            logits, aux = target_forward(self.target, self.trope, ids, caches, self.capture)
            pred = logits.argmax(-1).view(len(reqs), k + 1)
            accepted = forced or (drafts == pred[:, :k]).to(torch.int32).cumprod(1).sum(1).tolist()
            for c, base, a in zip(caches, bases, accepted):
                c.crop(base + a + 1)
            preds, auxs = list(pred), split_rows(aux, [k + 1] * len(reqs), dim=1)
        if forced is not None:
            preds = [self.forced.apply(drafts[i], p, a + 1) for i, (p, a) in enumerate(zip(preds, accepted))]
        return accepted, preds, auxs

    def extend(self, batch: ScheduleBatch, news, feats):
        """Drop the chains' own entries, re-extend with the true features of the committed tokens;
        returns the next first draft tokens (B,) and hidden states (1, B, h). ``news``: each request's
        committed tokens, or on the static path with verified counts the verify's (B, k+1) predictions
        (the counts stay on the device; the runner reads them and the features from the verify's
        buffers); ``feats``: the committed tokens' features (unused on the static path)."""
        reqs = batch.reqs
        if self.runner is not None:  # from the verify's buffers; forced acceptance's rewritten preds
            k = self.steps
            preds = (
                None
                if self.forced is None
                else torch.stack([torch.cat([x, x.new_zeros(k + 1 - x.shape[0])]) for x in news])
            )
            out = self.runner.extend([r.dcache for r in reqs], preds)
            for r in reqs:
                r.dcache.length = r.tcache.length
            return out
        caches = [r.dcache for r in reqs]
        for r, c, new in zip(reqs, caches, news):
            c.crop(r.tcache.length - new.shape[0])  # the committed length before this verify
        dl, dh = drafter_forward(
            self.drafter, self.drope, news, torch.cat(feats, dim=1) if len(feats) > 1 else feats[0], caches
        )
        ends = _ends([n.shape[0] for n in news])
        return self.drafter.to_target_ids(dl[ends].argmax(-1)), dh[:, ends]

    # ---- prefill and the baseline's decode step (not hooked) ----------------------------------------
    def prefill(self, batch: ScheduleBatch) -> BatchResult:
        """Each new request's prompt through the target (packed), the drafter extended over it pairing
        feature t with token t+1; the target's next token is the first output token."""
        reqs, runner = batch.reqs, self.runner
        ids = [torch.tensor(r.origin_input_ids, dtype=torch.long, device=self.device) for r in reqs]
        if runner is not None:  # one eager forward per prompt, each in its own new slot
            outs = []
            for r, x in zip(reqs, ids):
                r.tcache = runner.alloc()
                r.dcache = SlotCache(r.tcache.slot, r.tcache.max_len)
                outs.append(runner.prefill(r.tcache, x.view(1, -1)))
            logits = torch.cat([lg for lg, _ in outs])
            aux = torch.cat([a for _, a in outs], dim=1) if self.drafter is not None else None
        else:
            for r in reqs:
                r.tcache = self.target.new_cache(self.context + self.margin)
                if self.drafter is not None:
                    r.dcache = self.drafter.new_cache(self.context + self.margin)
            logits, aux = target_forward(self.target, self.trope, ids, [r.tcache for r in reqs], self.capture)
        ends = _ends([x.shape[0] for x in ids])
        lasts = logits[ends].argmax(-1)
        for i, r in enumerate(reqs):
            r.last = lasts[i : i + 1]
        if self.drafter is not None:
            shifted = [torch.cat([x[1:], r.last]) for x, r in zip(ids, reqs)]
            if runner is not None:
                parts = [
                    runner.prefill_drafter(r.dcache, x.view(1, -1), a)
                    for r, x, a in zip(reqs, shifted, split_rows(aux, [x.shape[0] for x in ids], dim=1))
                ]
                dl, dh = torch.cat([d for d, _ in parts]), torch.cat([h for _, h in parts], dim=1)
            else:
                dl, dh = drafter_forward(self.drafter, self.drope, shifted, aux, [r.dcache for r in reqs])
            firsts = self.drafter.to_target_ids(dl[ends].argmax(-1))
            for i, r in enumerate(reqs):
                r.first, r.h_last = firsts[i : i + 1], dh[:, ends[i] : ends[i] + 1]
        return BatchResult([r.last for r in reqs])

    def decode(self, batch: ScheduleBatch) -> BatchResult:
        """The baseline: one target forward of each request's last token."""
        reqs = batch.reqs
        if self.runner is not None:
            toks = self.runner.decode([r.tcache for r in reqs], torch.cat([r.last for r in reqs]))
            for i, r in enumerate(reqs):
                r.last = toks[i : i + 1]
        else:
            logits, _ = target_forward(self.target, self.trope, [r.last for r in reqs], [r.tcache for r in reqs], None)
            toks = logits.argmax(-1)
            for i, r in enumerate(reqs):
                r.last = toks[i : i + 1]
        return BatchResult([r.last for r in reqs])


def _ends(lengths: list[int]) -> list[int]:
    out, total = [], 0
    for n in lengths:
        total += n
        out.append(total - 1)
    return out


def generation(req: Req, steps: int) -> Generation:
    """A finished request's answer (what the rank sends the front)."""
    return Generation(
        output_ids=list(req.output_ids),
        prompt_tokens=len(req.origin_input_ids),
        verify_ct=req.spec_verify_ct,
        correct_drafts=req.spec_num_correct_drafts,
        proposed_drafts=req.spec_verify_ct * steps,
        histogram=list(req.histogram),
        decode_steps=req.decode_steps,
        inflight_cycles=req.inflight_cycles,
    )
