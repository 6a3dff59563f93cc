"""A running batch of requests, the shape SGLang's scheduler hands its model worker, and the packed
(ragged) forwards that run it on the eager path.

- ``ScheduleBatch``: what ``Decoder.cycle`` receives -- ``reqs`` (each a :class:`Req` with ``.rid``)
  and ``forward_mode`` (``is_decode()`` / ``is_extend()`` / ``is_idle()``), as SGLang 0.5.23's
  ``managers/schedule_batch.py`` ScheduleBatch is passed to ``EAGLEWorkerV2.forward_batch_generation``.
- ``Req``: one request's own KV caches (target and drafter), its committed output and SGLang's
  per-request counters (``spec_verify_ct`` counts only the verifies whose result was committed).
- ``target_forward`` / ``drafter_forward``: one forward over every request's new tokens packed in one
  row (SGLang's ragged "extend" layout): the projections, MLPs and heads run once over all tokens,
  attention runs per request over that request's own cache. At one request they run exactly the ops
  of ``LlamaTarget.forward`` / ``Eagle3Drafter.forward``.

Caches hold ``steps + 1`` slots past the context (and RoPE tables as long): under the overlap
scheduler a request that result N finishes still runs one more cycle (SGLang's in-flight cycle), whose
positions may pass the last one a request may commit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from spec_decode.engines.embedded.model import causal_mask, rope_tables


class ForwardMode(enum.IntEnum):
    """SGLang's ForwardMode, the members this engine runs (``model_executor/forward_batch_info.py``)."""

    EXTEND = 1  # prefill
    DECODE = 2
    IDLE = 5

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclass(eq=False)
class Req:
    """One request (SGLang's ``Req``): ``rid``, prompt, ``max_new_tokens``, ``output_ids`` (committed,
    processed results only), counters, and the decoding state that the cycles advance."""

    rid: str
    origin_input_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    stream: bool = False
    # SGLang's per-request speculative counters (meta_info spec_*)
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    histogram: list[int] = field(default_factory=list)
    decode_steps: int = 0
    inflight_cycles: int = 0  # cycles run after the result that finished it (not counted)
    # decoding state, advanced by the cycles ("device side": ahead of output_ids under overlap)
    tcache: object = None
    dcache: object = None
    last: torch.Tensor | None = None  # committed, not yet in the target cache
    first: torch.Tensor | None = None  # the next cycle's first draft token
    h_last: torch.Tensor | None = None  # the drafter hidden state that produced it

    def next_output_finishes_by_length(self) -> bool:
        """SGLang's ``Req.next_output_finishes_by_length`` (schedule_batch.py 1661-1663)."""
        return len(self.output_ids) + 1 >= self.max_new_tokens


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    def copy(self) -> ScheduleBatch:
        return ScheduleBatch(list(self.reqs), self.forward_mode)


class BatchResult:
    """A cycle's outcome per request (in ``batch.reqs`` order): the committed ids and, with
    speculation, the accepted draft count. ``accept_lens`` (bonus included) is read by the profiler
    plugin from the return value of its AROUND hook on ``cycle``, as from SGLang's batch result.

    Two forms: ``new_ids`` (one tensor of committed ids per request; ``accepted_drafts`` known on the
    host), or, from the static path with verified counts, ``preds`` (n, k+1) and ``accepted`` (n,) on the
    device: the host learns the counts only from this result's copy (``host_ids``), which also settles
    the caches' host lengths (``SlotCache.settle``). ``accept_lens`` is then a device tensor, which the
    profiler copies behind its end event without a wait (as SGLang's).

    ``copy_to_cpu`` / ``host_ids``: SGLang's ``GenerationBatchResult.copy_to_cpu`` and the
    ``copy_done.synchronize()`` of ``process_batch_result``. On CUDA the loop starts the ids' copy to
    the host right after launching the cycle (non-blocking, into pinned memory, an event behind it), and
    reads them when it processes the result: a wait for *this* cycle only. A plain ``.tolist()`` there
    would be queued behind the next cycle, already launched under the overlap scheduler, and wait for it
    too: the GPU then idles while the host processes, schedules and launches (measured on the H200, 8B
    shape: docs/embedded-engine.md "The result copy that waited for the next cycle")."""

    def __init__(
        self,
        new_ids: list[torch.Tensor] | None = None,
        accepted_drafts: list[int] | None = None,
        *,
        preds: torch.Tensor | None = None,
        accepted: torch.Tensor | None = None,
        caches: list | None = None,
    ):
        self.new_ids, self._accepted_drafts = new_ids, accepted_drafts
        self.preds, self.accepted, self.caches = preds, accepted, caches
        self.copy_done: torch.cuda.Event | None = None
        self._host: list[torch.Tensor] | None = None
        self._ids: list[list[int]] | None = None

    @property
    def accept_lens(self):
        if self.accepted is not None:
            return self.accepted + 1
        return [len(ids) for ids in self.new_ids]

    @property
    def accepted_drafts(self) -> list[int] | None:
        if self.accepted is not None and self._accepted_drafts is None:
            self.host_ids()
        return self._accepted_drafts

    def _device_tensors(self) -> list[torch.Tensor]:
        if self.accepted is not None:
            return [self.preds.reshape(-1), self.accepted.reshape(-1)]
        return [torch.cat([x.reshape(-1) for x in self.new_ids])] if self.new_ids else []

    def copy_to_cpu(self) -> None:
        """Start the ids' copy to the host (CUDA only; elsewhere the ids are host tensors already)."""
        parts = self._device_tensors()
        if not parts or parts[0].device.type != "cuda":
            return
        self._host = []
        for x in parts:
            h = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            h.copy_(x, non_blocking=True)
            self._host.append(h)
        self.copy_done = torch.cuda.Event()
        self.copy_done.record()

    def host_ids(self) -> list[list[int]]:
        """Each request's committed ids as ints: after ``copy_to_cpu``, a wait for its event only."""
        if self._ids is not None:
            return self._ids
        if self._host is not None:
            self.copy_done.synchronize()
            flat = [x.tolist() for x in self._host]
        else:
            flat = [x.tolist() for x in self._device_tensors()]
        if self.accepted is not None:
            preds, acc = flat
            t = self.preds.shape[1]
            self._accepted_drafts = acc
            self._ids = [preds[i * t : i * t + a + 1] for i, a in enumerate(acc)]
            for c, a in zip(self.caches or [], acc):
                c.settle(t, a)
            return self._ids
        out, at = [], 0
        for x in self.new_ids:
            n = x.numel()
            out.append(flat[0][at : at + n])
            at += n
        self._ids = out
        return out


class Rope:
    """cos/sin tables ``margin`` positions longer than the model's (identical values below it)."""

    def __init__(self, model, margin: int):
        s = model.shape
        cos, sin = rope_tables(s.head_dim, s.max_position_embeddings + margin, s.rope_theta)
        w = model.lm_head.weight
        self.cos, self.sin = cos.to(w.device, w.dtype), sin.to(w.device, w.dtype)

    def at(self, starts: list[int], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if len(starts) == 1:
            s, t = starts[0], lengths[0]
            return self.cos[s : s + t], self.sin[s : s + t]
        return (
            torch.cat([self.cos[s : s + t] for s, t in zip(starts, lengths)]),
            torch.cat([self.sin[s : s + t] for s, t in zip(starts, lengths)]),
        )


def _attend_segments(caches, layer: int, q, k, v, starts, lengths, masks) -> torch.Tensor:
    """Each request's queries over its own cache; the outputs packed back in order."""
    if len(caches) == 1:
        return caches[0].attend(layer, q, k, v, starts[0], masks[0])
    outs, off = [], 0
    for cache, s, t, m in zip(caches, starts, lengths, masks):
        outs.append(cache.attend(layer, q[:, :, off : off + t], k[:, :, off : off + t], v[:, :, off : off + t], s, m))
        off += t
    return torch.cat(outs, dim=2)


def _layout(caches, lengths):
    starts = [c.length for c in caches]
    for c, s, t in zip(caches, starts, lengths):
        if s + t > c.max_len:
            raise ValueError(f"sequence of {s + t} tokens exceeds the cache of {c.max_len}")
    return starts


def target_forward(target, rope: Rope, ids: list[torch.Tensor], caches: list, capture: list[int] | None):
    """Packed incremental forward: request i's 1-D ``ids[i]`` at positions ``caches[i].length..``.
    Returns logits (N, V) and the captured features (1, N, len(capture) * h) or None, N = all tokens."""
    lengths = [x.shape[0] for x in ids]
    starts = _layout(caches, lengths)
    n = sum(lengths)
    cos, sin = rope.at(starts, lengths)
    masks = [causal_mask(s, t, ids[0].device) for s, t in zip(starts, lengths)]
    x = target.model.embed_tokens(torch.cat(ids).view(1, n))
    outs = {}
    reduce = target.tp.reduce
    for i, layer in enumerate(target.model.layers):
        attn = layer.self_attn
        q, k, v = attn.qkv_sharded(layer.input_layernorm(x), cos, sin)
        a = _attend_segments(caches, i, q, k, v, starts, lengths, masks)
        x = x + reduce(attn.out_partials(a)).view(1, n, -1)
        x = x + reduce(layer.mlp.partials(layer.post_attention_layernorm(x))).view(1, n, -1)
        if capture and i in capture:
            outs[i] = x
    for c, s, t in zip(caches, starts, lengths):
        c.length = s + t
    logits = target.lm_head(target.model.norm(x))[0]
    aux = torch.cat([outs[i] for i in capture], dim=-1) if capture else None
    return logits, aux


def drafter_forward(drafter, rope: Rope, tokens: list[torch.Tensor], hidden: torch.Tensor, caches: list):
    """Packed drafter step: request i's 1-D ``tokens[i]`` with its rows of ``hidden`` (1, N, w).
    Returns draft-vocab logits (N, Vd) and the pre-norm hidden state (1, N, h)."""
    lengths = [x.shape[0] for x in tokens]
    starts = _layout(caches, lengths)
    n = sum(lengths)
    cos, sin = rope.at(starts, lengths)
    masks = [causal_mask(s, t, tokens[0].device) for s, t in zip(starts, lengths)]
    x, residual = drafter._inputs(torch.cat(tokens).view(1, n), hidden)
    q, k, v = drafter.midlayer.self_attn.qkv(x, cos, sin)
    a = _attend_segments(caches, 0, q, k, v, starts, lengths, masks)
    for c, s, t in zip(caches, starts, lengths):
        c.length = s + t
    logits, h = drafter._finish(a, residual)
    return logits[0], h


def split_rows(x: torch.Tensor, lengths: list[int], dim: int = 0) -> list[torch.Tensor]:
    return list(x.split(lengths, dim=dim)) if len(lengths) > 1 else [x]
