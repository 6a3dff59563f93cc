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

log = logging.getLogger("spec_decode.embedded")


class StaticRunner:
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

    # ---- the shapes (each reads and writes only its own buffers) --------------------------------------
    def _add_bucket(self, b: int) -> None:
        dev, h, k = self.device, self.target.shape.hidden_size, self.k
        long, f = dict(dtype=torch.long, device=dev), dict(device=dev)
        if self.drafter is None:
            self._add(
                f"decode@{b}",
                b,
                1,
                {"ids": torch.zeros(1, b, **long), "pos": torch.zeros(b, **long), "tok": torch.zeros(b, **long)},
                self._decode,
            )
            return
        t, width = k + 1, len(self.capture_ids) * h
        self._add(
            f"verify@{b}",
            b,
            t,
            {
                "ids": torch.zeros(1, b * t, **long),
                "pos": torch.zeros(b * t, **long),
                "pred": torch.zeros(b, t, **long),
                "accepted": torch.zeros(b, **long),
                "aux": torch.zeros(1, b * t, width, **f),
            },
            self._verify,
        )
        if k > 1:  # steps 1 drafts nothing past the re-extend's first token
            self._add(
                f"draft@{b}",
                b,
                1,
                {
                    "tok": torch.zeros(1, b, **long),
                    "h": torch.zeros(1, b, h, **f),
                    "pos": torch.zeros(b, **long),
                    "next": torch.zeros(b, k - 1, **long),
                },
                self._draft,
            )
        self._add(
            f"extend@{b}",
            b,
            t,
            {
                "ids": torch.zeros(1, b * t, **long),
                "feats": torch.zeros(1, b * t, width, **f),
                "pos": torch.zeros(b * t, **long),
                "last": torch.zeros(b, **long),
                "first": torch.zeros(b, **long),
                "h_out": torch.zeros(1, b, h, **f),
            },
            self._extend,
        )

    def _add(self, name: str, b: int, t: int, bufs: dict, fn) -> None:
        bufs["slots"] = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
        bufs["trows"] = self.tcache.rows(bufs["slots"], t)
        if self.dcache is not None:
            bufs["drows"] = self.dcache.rows(bufs["slots"], t)
        self.bufs[name] = bufs
        run = lambda: fn(bufs)  # noqa: E731
        if self.compile:  # no autograd graph to trace (a caller outside no_grad: the weights require grad)
            run = torch.compile(torch.no_grad()(run), fullgraph=True, dynamic=False, backend=self.compile_backend)
        self.fns[name] = run

    def _decode(self, b) -> None:
        logits, _ = self.target.forward_static(
            b["ids"], b["pos"], b["trows"], rot_rows=not self.compile, dense=self.compile
        )
        b["tok"].copy_(logits.argmax(-1))

    def _verify(self, b) -> None:
        logits, aux = self.target.forward_static(
            b["ids"], b["pos"], b["trows"], self.capture_ids, rot_rows=not self.compile, dense=self.compile
        )
        pred = logits.argmax(-1).view(b["pred"].shape)
        b["pred"].copy_(pred)
        drafts = b["ids"].view(b["pred"].shape)[:, 1:]
        b["accepted"].copy_((drafts == pred[:, : self.k]).to(torch.int32).cumprod(1).sum(1))
        b["aux"].copy_(aux)

    def _draft(self, b) -> None:
        tok, h = b["tok"], b["h"]
        for j in range(self.k - 1):  # unrolled: the chain is one graph (and one compiled function)
            dl, h = self.drafter.forward_static(tok, h, b["pos"] + j, b["drows"], rot_rows=not self.compile)
            nxt = self.drafter.to_target_ids(dl.argmax(-1))
            b["next"][:, j].copy_(nxt)
            tok = nxt.view(1, -1)

    def _extend(self, b) -> None:
        dl, dh = self.drafter.forward_static(b["ids"], b["feats"], b["pos"], b["drows"], rot_rows=not self.compile)
        b["first"].copy_(self.drafter.to_target_ids(dl.index_select(0, b["last"]).argmax(-1)))
        b["h_out"].copy_(dh.index_select(1, b["last"]))

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

    def _device_positions(self, bufs: dict, t: int) -> None:
        """Each row's positions tlen[slot] + 0..t-1 into ``bufs["pos"]``, on the device (padding rows:
        the scratch slot, length 0)."""
        starts = self.tlen.index_select(0, bufs["slots"])
        bufs["pos"].view(-1, t).copy_(starts[:, None] + self.arange[:t])

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
        self._device_positions(b, 1)  # the drafter's length equals the target's at a cycle's start
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
        self._device_positions(b, t)
        out = self.run(name)
        # No host read: the counts (verified, or forced ones, drawn on the host as SGLang's simulated
        # acceptance does) advance each slot's length on the device, and the host queues the re-extend
        # and the next cycle while the verify runs. Padding rows count 0 (their slot stays at 0).
        real = self.arange[:size] < n  # no scalar setitem on the device: that is a copy and a stream sync
        if accept is None:
            rows = torch.where(real, out["accepted"], 0)
            for c in caches:
                c.length += t  # an upper bound until the result is processed (SlotCache.settle)
        else:
            rows = torch.zeros(size, dtype=torch.long)
            rows[:n] = torch.tensor(list(accept), dtype=torch.long)
            rows = rows.to(self.device, non_blocking=True)
            for c, a in zip(caches, accept):
                c.length += a + 1
        self.tlen.index_add_(0, b["slots"], torch.where(real, rows + 1, 0))
        self.last_verify = (name, size, rows)
        aux = out["aux"].view(size, t, -1)[:n]
        accepted = rows[:n] if accept is None else list(accept)
        return accepted, out["pred"][:n].clone(), aux  # pred's tokens are kept (committed): a copy

    def extend(self, caches: list[SlotCache], preds: torch.Tensor | None = None):
        """The drafter re-extended over each row's committed tokens, from the last verify's buffers
        (its positions, features and accepted counts; its predictions, or ``preds`` (n, k+1) when forced
        acceptance rewrote them): returns the next first draft tokens (n,) and hidden states (1, n, h).
        The caller sets the drafter caches' lengths (the target's, after the verify)."""
        n, t = len(caches), self.k + 1
        vname, size, rows = self.last_verify
        v = self.bufs[vname]
        b, name, esize = self._rows("extend", caches)
        assert esize == size, (esize, size)
        b["ids"].copy_(v["pred"].view(1, -1))
        if preds is not None:
            b["ids"].view(size, t)[:n].copy_(preds)
        b["feats"].copy_(v["aux"])
        b["pos"].copy_(v["pos"])
        b["last"].copy_(self.arange[:size] * t + rows)  # each row's last committed index (padding: 0)
        out = self.run(name)
        return out["first"][:n].clone(), out["h_out"][:, :n].clone()
