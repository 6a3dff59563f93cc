"""The embedded engine's static path (the CUDA path): request slots in static KV caches, static
buffers, and one CUDA graph per shape and batch-size bucket, like SGLang's CUDA-graph runner
(``--cuda-graph-max-bs-decode``; the bucket rule is buckets.py's).

Shapes, for each bucket b of ``buckets.capture_bs(max_bs)`` (k = speculative steps), named
``<phase>@<b>``:

- ``decode``: the target over 1 token per row -> next token (the baseline);
- ``verify``: the target over k+1 tokens per row -> argmax per position, accepted count per row,
  captured features;
- ``draft`` (k > 1): the k-1 drafter steps of a cycle, each row on its own hidden state -> k-1 draft
  tokens (target ids): one graph for the whole chain, as SGLang's EAGLEDraftCudaGraphRunner captures
  the multi-step draft, so the host issues one replay per cycle for it, not k-1 replays and their copies;
- ``extend``: the drafter re-extended over each row's accepted tokens, every row padded to k+1 tokens
  (the verify's predictions, features and positions) with its own last valid index -> first draft,
  hidden. A padded position writes drafter K/V past the row's length: no query of that row sees it
  (the mask is ``key <= pos``) and the row's next draft step writes that position before any query
  at or beyond it runs.

A running batch of n rows runs in ``bucket(n)``: row i holds request i's slot, positions and inputs;
the padding rows read the scratch slot (the caches' last) at positions 0.., compute on whatever their
buffers hold and are dropped. Above the largest bucket the same functions run eagerly at exactly n
rows (said once in the log). Every shape runs ``forward_static`` (fixed shapes, positions and slots
as device tensors, attention over each row's whole slot under a mask) on buffers allocated once; with
graphs on each shape is captured at start-up (capture.py) and replayed, with ``--disable-cuda-graph``
(and on CPU) the same functions run eagerly, so the two agree token for token. A prompt's prefill
runs eagerly (its length varies). The host reads nothing inside a cycle: each slot's committed length
lives on the device too (``tlen``), the positions of draft, verify and extend are computed from it there,
and the verify's accepted counts update it there, so with real acceptance the counts reach the host only
with the result's copy (SGLang's EAGLEWorkerV2 keeps them on the device the same way). The host keeps an
upper bound of each length (``SlotCache.length``: +k+1 per launched verify, corrected by
``SlotCache.settle`` when the result is processed), which is all it needs (room for a cycle).

On CUDA the shapes run in fewer kernels by default (``graph_ops``: fused RMSNorm, RoPE from rotated
projection rows, bmm attention; model.py's prepare_graph_ops): a step of this tiny model costs what
its kernels cost, not their arithmetic (docs/embedded-engine.md has the per-shape profile).
"""

from __future__ import annotations

import logging

import torch

from spec_decode.engines.embedded import capture, slot_attention
from spec_decode.engines.embedded.buckets import bucket, capture_bs
from spec_decode.engines.embedded.kvcache import SlotCache
from spec_decode.engines.embedded.static_shapes import ShapeFunctions

log = logging.getLogger("spec_decode.embedded")


class StaticRunner(ShapeFunctions):
    def __init__(
        self,
        target,
        drafter,
        steps: int,
        use_graphs: bool,
        graph_ops: bool | None = None,
        attention: str | None = None,
        max_bs: int = 1,
        slots: int | None = None,
        compile: bool = False,
        compile_backend: str = "inductor",
        proj_split: int = 0,
    ):
        """``max_bs``: the largest captured batch size (SGLang's --cuda-graph-max-bs-decode);
        ``slots``: requests the caches hold (default max_bs; the server's --max-running-requests),
        plus one scratch slot for padding rows. ``graph_ops`` (default: on CUDA) computes the shapes
        in fewer kernels (model.py's prepare_graph_ops; it changes the models it is given, for every
        runner on them), with ``attention`` "bmm" (on an H200 SDPA's fp32 kernel took 104 us
        per layer for one query over the 1024 slots, baddbmm/softmax/bmm 12 us;
        benchmarks/gpu/engine_profile.py), "sdpa", or "slots" (slot_attention's Triton kernels: each
        row's slot read in place up to its position; CUDA, bf16/fp16; "slots1" the same in one kernel a layer,
        a variant for benchmarks/gpu/real_shape.py --attention until measured). Default (None): "slots" when
        compiling a bf16/fp16 model on CUDA with Triton (the 8B shape's gathers, SDPA and cache writes
        were 0.71 of a 5.30 ms decode step), else "bmm". Graphs or eager, the same kernels run.
        ``compile``: each shape's function through ``torch.compile`` (inductor: the elementwise work
        between the GEMMs and attention fused into generated kernels; RoPE from the plain q/k, without
        graph_ops' rotated rows), compiled in the warm-up before capture; off by default (~30 s of
        start-up per step count on the 8B shape; other rounding, as graph_ops)."""
        self.compile, self.compile_backend = compile, compile_backend  # backend: tests ("aot_eager")
        # compiled only: o/down as that many fp32 partials summed inside the next fused norm (a variant,
        # LlamaTarget.forward_static's ``split``; benchmarks/gpu/real_shape.py --proj-split)
        self.proj_split = proj_split if compile else 0
        ks = (target.model.layers[0].self_attn.u_o.shape, target.model.layers[0].mlp.u_down.shape)
        if self.proj_split > 1 and any((n * k) % self.proj_split for n, k, _ in ks):
            raise ValueError(
                f"proj_split={proj_split}: o_proj's and down_proj's inputs ({', '.join(str(n * k) for n, k, _ in ks)} "
                "per row) must both divide by it; use a divisor of both (e.g. 2 or 4)"
            )
        if compile:
            # start-up: dynamo loads only when compiling. Every shape of every runner in the process is
            # the same lambda's code, so each is one more recompile of it: allow this runner's too
            from torch import _dynamo

            _dynamo.config.recompile_limit += 4 * len(capture_bs(max_bs))
        self.target, self.drafter, self.k = target, drafter, steps
        dev = target.lm_head.weight.device
        self.device = dev
        self.pin_puts = False  # _put through pinned memory (measured slower: see _put); benchmarks/gpu/put_sync.py
        self.sizes = capture_bs(max_bs)
        self.max_bs = max_bs
        self.n_slots = max(slots or max_bs, 1)
        self.scratch = self.n_slots  # the padding rows' slot
        self.free_slots = list(range(self.n_slots))
        self.use_graphs = use_graphs and dev.type == "cuda"
        self.capture_ids = list(drafter.shape.aux_layer_ids) if drafter is not None else None
        self.tcache = target.new_static_cache(self.n_slots + 1)
        self.dcache = drafter.new_static_cache(self.n_slots + 1) if drafter is not None else None
        self.context = self.tcache.max_len
        self.graph_ops = dev.type == "cuda" if graph_ops is None else graph_ops
        if attention is None:
            attention = "slots" if compile and slot_attention.unavailable_reason(self.tcache.k) is None else "bmm"
        self.attention = attention if self.graph_ops else "sdpa"
        if self.graph_ops:
            for model, cache in ((target, self.tcache), (drafter, self.dcache)):
                if model is not None:
                    if not model.graph_ops:
                        model.prepare_graph_ops()
                    cache.prepare_graph_ops(attention)
        self.arange = torch.arange(target.shape.max_position_embeddings, device=dev)
        # Each slot's committed target length, on the device (the scratch slot's stays 0: padding rows
        # run at positions 0..): the positions of a cycle's phases come from it without a host read.
        self.tlen = torch.zeros(self.n_slots + 1, dtype=torch.long, device=dev)
        self.fns: dict[str, callable] = {}
        self.bufs: dict[str, dict[str, torch.Tensor]] = {}
        self.use_forced: dict[str, bool] = {}  # per verify shape: its device flag as last set
        for b in self.sizes:
            self._add_bucket(b)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.capture_error: str | None = None
        self.eager_above_logged = False
        if self.use_graphs:
            capture.capture_or_fall_back(self)

    @property
    def graph_bs(self) -> list[int]:
        """The batch sizes whose graphs replay ([] when eager)."""
        return list(self.sizes) if self.use_graphs and self.graphs else []

    # ---- running ------------------------------------------------------------------------------------
    def shape(self, phase: str, n: int) -> tuple[str, int]:
        """The shape a batch of ``n`` rows runs in: its bucket's, or above the largest bucket an eager
        shape of exactly n rows (made on first use)."""
        b = bucket(n, self.sizes)
        if b is None:
            b = n
            if n > self.n_slots:
                raise ValueError(
                    f"a batch of {n} requests: the static path holds {self.n_slots} (--max-running-requests)"
                )
            if f"{phase}@{n}" not in self.bufs:
                self._add_bucket(n)
            if not self.eager_above_logged:
                self.eager_above_logged = True
                log.warning(
                    "a running batch of %d requests is above --cuda-graph-max-bs-decode %d: batches "
                    "above it run the static shapes eagerly (no CUDA graph); said once",
                    n,
                    self.max_bs,
                )
        return f"{phase}@{b}", b

    def _put(self, buf: torch.Tensor, values: list[int]) -> None:
        """Host values into a shape's buffer (non_blocking, from pageable memory: such a small copy does
        not wait for the stream, measured on the H200 with 100 ms of GPU work queued). ``pin_puts`` sends
        them through pinned memory instead, a benchmark knob: off, because benchmarks/gpu/put_sync.py
        measured it 2.8% slower on the 8B steps-1 cycle (docs/embedded-engine.md, seventh GPU session)."""
        src = torch.tensor(values, dtype=torch.long)
        buf.copy_(src.pin_memory() if self.pin_puts else src, non_blocking=True)

    def _rows(self, phase: str, caches: list[SlotCache]) -> tuple[dict, str, int]:
        name, b = self.shape(phase, len(caches))
        bufs = self.bufs[name]
        self._put(bufs["slots"], [c.slot for c in caches] + [self.scratch] * (b - len(caches)))
        return bufs, name, b

    def _positions(self, starts: list[int], b: int, t: int) -> list[int]:
        starts = starts + [0] * (b - len(starts))  # padding rows at positions 0..t-1 of the scratch slot
        return [s + j for s in starts for j in range(t)]

    def run(self, name: str) -> dict[str, torch.Tensor]:
        """Run shape ``name`` (replay its graph, or eagerly); its buffers."""
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
        else:
            self.fns[name]()
        return self.bufs[name]

    def replays(self, n: int) -> bool:
        """Whether a batch of ``n`` rows replays graphs (the decode log's ``cuda graph``)."""
        return bool(self.graphs) and bucket(n, self.sizes) is not None

    def agree_on_graphs(self, group=None) -> None:
        """At tp > 1: if any rank failed to capture, every rank runs eagerly."""
        if not capture.all_ranks_captured(self.use_graphs or self.capture_error is None, group) and self.use_graphs:
            self.graphs = {}
            self.use_graphs = False
            self.capture_error = "another rank's CUDA graph capture failed"
            log.error("CUDA graphs off on this rank too: %s", self.capture_error)

    # ---- slots ------------------------------------------------------------------------------------------
    def alloc(self) -> SlotCache:
        """A free request slot (a request joins); ``release`` gives it back."""
        if not self.free_slots:
            raise RuntimeError(f"the static path's {self.n_slots} request slots are all in use")
        return SlotCache(self.free_slots.pop(0), self.context)

    def release(self, cache: SlotCache) -> None:
        if cache.slot in self.free_slots:
            raise RuntimeError(f"slot {cache.slot} released twice")
        self.free_slots.append(cache.slot)
        self.free_slots.sort()

    # ---- what the Decoder calls (lists in the batch's row order) ------------------------------------
    def prefill(self, cache: SlotCache, ids: torch.Tensor):
        """Eager (the prompt's length varies): the target over one request's prompt; logits, aux."""
        t = ids.shape[1]
        slot = torch.tensor([cache.slot], device=self.device)
        logits, aux = self.target.forward_static(ids, self.arange[:t], self.tcache.rows(slot, t), self.capture_ids)
        cache.length = t
        self.tlen.index_fill_(0, slot, t)
        return logits, aux

    def prefill_drafter(self, cache: SlotCache, tokens: torch.Tensor, feats: torch.Tensor):
        t = tokens.shape[1]
        slot = torch.tensor([cache.slot], device=self.device)
        dl, dh = self.drafter.forward_static(tokens, feats, self.arange[:t], self.dcache.rows(slot, t))
        cache.length = t
        return dl, dh

    def decode(self, caches: list[SlotCache], toks: torch.Tensor) -> torch.Tensor:
        """The baseline step: toks (n,) -> next tokens (n,)."""
        n = len(caches)
        b, name, size = self._rows("decode", caches)
        b["ids"][0, :n].copy_(toks)
        self._put(b["pos"], self._positions([c.length for c in caches], size, 1))
        out = self.run(name)
        for c in caches:
            c.length += 1
        return out["tok"][:n].clone()

    def draft(self, caches: list[SlotCache], firsts: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """(n, k) drafts: ``firsts`` (n,) from the last re-extend, then k-1 drafter steps on h (1, n, h)."""
        n = len(caches)
        if self.k == 1:
            return firsts.view(n, 1)
        b, name, size = self._rows("draft", caches)
        b["tok"][0, :n].copy_(firsts)
        b["h"][:, :n].copy_(h)
        out = self.run(name)
        for c in caches:
            c.length += self.k - 1
        return torch.cat([firsts.view(n, 1), out["next"][:n]], dim=1)  # a copy: the buffer is reused

    def verify(
        self, caches: list[SlotCache], lasts: torch.Tensor, drafts: torch.Tensor, accept: list[int] | None = None
    ):
        """One target forward over each row's [last, d1..dk]; returns (accepted counts, preds (n, k+1),
        features (n, k+1, w)). ``accept``: forced acceptance (SGLANG_SIMULATE_ACC_LEN) -- commit these
        counts instead of the verified ones; the verify itself runs as always (its counts unread)."""
        n, t = len(caches), self.k + 1
        b, name, size = self._rows("verify", caches)
        ids = b["ids"].view(size, t)
        ids[:n, 0].copy_(lasts)
        ids[:n, 1:].copy_(drafts)
        forced = accept is not None
        if forced:  # drawn on the host as SGLang's simulated acceptance draws them; the verify still runs
            self._put(b["forced"], list(accept) + [0] * (size - n))
        if forced != self.use_forced.get(name):  # a device flag, set when it changes (not per cycle)
            b["use_forced"].fill_(forced)
            self.use_forced[name] = forced
        # No host read: the shape commits the counts (verified or forced) to each slot's length on the
        # device, and the host queues the re-extend and the next cycle while the verify runs.
        out = self.run(name)
        for c, a in zip(caches, accept if forced else [None] * n):
            c.length += t if a is None else a + 1  # verified: an upper bound until SlotCache.settle
        self.last_verify = (name, size, out["rows"])
        aux = out["aux"].view(size, t, -1)[:n]
        accepted = list(accept) if forced else out["rows"][:n].clone()  # the buffer is the next cycle's
        return accepted, out["pred"][:n].clone(), aux  # pred's tokens are kept (committed): a copy

    def extend(self, caches: list[SlotCache], preds: torch.Tensor | None = None):
        """The drafter re-extended over each row's committed tokens, from the last verify's buffers
        (its positions, features and accepted counts; its predictions, or ``preds`` (n, k+1) when forced
        acceptance rewrote them): returns the next first draft tokens (n,) and hidden states (1, n, h).
        The caller sets the drafter caches' lengths (the target's, after the verify)."""
        n = len(caches)
        vname, size, _ = self.last_verify
        name = f"extend@{size}"  # the verify's bucket: its buffers are the extend's inputs, in place
        assert len(caches) <= size and vname == f"verify@{size}", (vname, size, len(caches))
        if preds is not None:  # the verify's own predictions were returned as a copy: overwrite in place
            self.bufs[vname]["pred"][:n].copy_(preds)
        out = self.run(name)
        return out["first"][:n].clone(), out["h_out"][:, :n].clone()
