"""The embedded engine's CUDA path: static buffers and one CUDA graph per shape it replays, like SGLang's
CUDA-graph runner (decode, draft, verify and draft-extend graphs captured at start-up).

Shapes (batch 1, k = speculative steps):

- ``decode``: the target over 1 token -> next token (the baseline);
- ``verify``: the target over k+1 tokens -> argmax per position, accepted count, captured features;
- ``draft``: one drafter step on its own hidden state -> next draft token (target ids), hidden;
- ``extend<n>``, n = 1..k+1: the drafter re-extended over n accepted tokens -> first draft, hidden.

Every shape runs ``forward_static`` (fixed shapes, positions as a device tensor, attention over the
whole static KV cache under a mask), on buffers allocated once. With graphs on, each shape is
captured once at start-up and replayed; with ``--disable-cuda-graph`` the same functions run eagerly,
launching the same kernels, so the two agree token for token. The prompt's prefill runs eagerly
(its length varies). The host reads one number per cycle (the accepted count), as the eager path does.
On CUDA the shapes run in fewer kernels by default (``graph_ops``: fused RMSNorm, RoPE from rotated
projection rows, bmm attention; model.py's prepare_graph_ops): a step of this tiny model costs what
its kernels cost, not their arithmetic (docs/embedded-engine.md has the per-shape profile).

At tp > 1 the target's all-reduces (``parallel.TensorParallel.reduce``) are captured inside the
graphs (NCCL). A capture of a c10d collective hangs if the communicator is created or used
differently inside the capture, so: ``init_process_group`` gets ``device_id`` (eager communicator),
every shape is first run eagerly on the capture stream (which warms NCCL on that stream), the device
is synchronised, and capture uses that same stream with ``capture_error_mode="thread_local"`` (the
c10d watchdog thread may query events meanwhile).
"""

from __future__ import annotations

import gc
import logging

import torch
import torch.distributed as dist

log = logging.getLogger("spec_decode.embedded")
WARMUP_RUNS = 2  # eager runs per shape before capture: lazy inits (cuBLAS handles, NCCL) happen here


class StaticRunner:
    def __init__(self, target, drafter, steps: int, use_graphs: bool, graph_ops: bool | None = None,
                 attention: str = "bmm"):
        """``graph_ops`` (default: on CUDA) computes the shapes in fewer kernels (model.py's
        prepare_graph_ops; it changes the models it is given, for every runner on them), with
        ``attention`` "bmm" (default: on an H200 SDPA's fp32 kernel took 104 us per layer for one
        query over the 1024 slots, baddbmm/softmax/bmm 12 us; benchmarks/gpu/engine_profile.py) or
        "sdpa". Graphs or eager, the same kernels run."""
        self.target, self.drafter, self.k = target, drafter, steps
        dev = target.lm_head.weight.device
        self.device = dev
        self.use_graphs = use_graphs and dev.type == "cuda"
        self.capture_ids = list(drafter.shape.aux_layer_ids) if drafter is not None else None
        self.tcache = target.new_static_cache()
        self.dcache = drafter.new_static_cache() if drafter is not None else None
        self.graph_ops = dev.type == "cuda" if graph_ops is None else graph_ops
        if self.graph_ops:
            for model, cache in ((target, self.tcache), (drafter, self.dcache)):
                if model is not None:
                    if not model.graph_ops:
                        model.prepare_graph_ops()
                    cache.prepare_graph_ops(attention)
        self.arange = torch.arange(target.shape.max_position_embeddings, device=dev)
        h, long = target.shape.hidden_size, dict(dtype=torch.long, device=dev)
        zeros = dict(device=dev)
        self.fns: dict[str, callable] = {}
        self.bufs: dict[str, dict[str, torch.Tensor]] = {}
        self._add("decode", {"ids": torch.zeros(1, 1, **long), "pos": torch.zeros(1, **long),
                             "tok": torch.zeros(1, 1, **long)}, self._decode)
        if drafter is not None:
            k, width = steps, len(self.capture_ids) * h
            self._add("verify", {"ids": torch.zeros(1, k + 1, **long), "pos": torch.zeros(k + 1, **long),
                                 "pred": torch.zeros(k + 1, **long), "accepted": torch.zeros((), **long),
                                 "aux": torch.zeros(1, k + 1, width, **zeros)}, self._verify)
            self._add("draft", {"tok": torch.zeros(1, 1, **long), "h": torch.zeros(1, 1, h, **zeros),
                                "pos": torch.zeros(1, **long), "next": torch.zeros(1, **long),
                                "h_out": torch.zeros(1, 1, h, **zeros)}, self._draft)
            for n in range(1, k + 2):
                self._add(f"extend{n}", {"ids": torch.zeros(1, n, **long), "feats": torch.zeros(1, n, width, **zeros),
                                         "pos": torch.zeros(n, **long), "first": torch.zeros(1, **long),
                                         "h_out": torch.zeros(1, 1, h, **zeros)}, self._extend)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.capture_error: str | None = None
        if self.use_graphs:
            self._capture_or_fall_back()

    # ---- the shapes (each reads and writes only its own buffers) --------------------------------------
    def _add(self, name: str, bufs: dict, fn) -> None:
        self.bufs[name] = bufs
        self.fns[name] = lambda: fn(bufs)

    def _decode(self, b) -> None:
        logits, _ = self.target.forward_static(b["ids"], b["pos"], self.tcache)
        b["tok"].copy_(logits[-1:].argmax(-1).view(1, 1))

    def _verify(self, b) -> None:
        logits, aux = self.target.forward_static(b["ids"], b["pos"], self.tcache, self.capture_ids)
        pred = logits.argmax(-1)
        b["pred"].copy_(pred)
        b["accepted"].copy_((b["ids"][0, 1:] == pred[: self.k]).to(torch.int32).cumprod(0).sum())
        b["aux"].copy_(aux)

    def _draft(self, b) -> None:
        dl, h = self.drafter.forward_static(b["tok"], b["h"], b["pos"], self.dcache)
        b["next"].copy_(self.drafter.to_target_ids(dl[-1].argmax()).view(1))
        b["h_out"].copy_(h)

    def _extend(self, b) -> None:
        dl, dh = self.drafter.forward_static(b["ids"], b["feats"], b["pos"], self.dcache)
        b["first"].copy_(self.drafter.to_target_ids(dl[-1].argmax()).view(1))
        b["h_out"].copy_(dh[:, -1:])

    # ---- running ------------------------------------------------------------------------------------
    def run(self, name: str, start: int) -> dict[str, torch.Tensor]:
        """Run shape ``name`` at positions start.. (replay its graph, or eagerly); its buffers."""
        b = self.bufs[name]
        torch.add(self.arange[: b["pos"].shape[0]], start, out=b["pos"])
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
        else:
            self.fns[name]()
        return b

    def _capture_all(self) -> None:
        """Warm every shape on the capture stream, then capture each with the garbage collector frozen
        (SGLang's ``freeze_gc``, model_executor/runner/base_cuda_graph_runner.py 47-62).

        Why (CUBLAS_STATUS_INTERNAL_ERROR inside a capture on the H200, issue 26): torch keeps one
        cuBLAS workspace per (handle, stream), and destroying a CUDA graph clears the workspaces of the
        stream it was captured on; ``torch.cuda.Stream()`` hands out streams from a small pool, so an
        earlier runner's capture stream is often ours. Such a runner lives in a reference cycle
        (``fns`` closes over it), so it dies only in a garbage collection -- and ``torch.cuda.graph``
        runs one right before ``capture_begin``: the workspace our warmup made was freed just before
        the capture, and cuBLAS met the capture without one. So: collect first (dead graphs go now),
        warm up and synchronise, and keep collections out of the capture window."""
        gc.collect()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for fn in self.fns.values():  # on the capture stream: NCCL and cuBLAS warm up there
                for _ in range(WARMUP_RUNS):
                    fn()
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()
        gc.freeze()  # torch.cuda.graph's own gc.collect() then finds no earlier runner to destroy
        try:
            for name, fn in self.fns.items():  # the same order on every rank: collectives pair up
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    fn()
                torch.cuda.synchronize(self.device)
                self.graphs[name] = graph
        finally:
            gc.unfreeze()
        self.capture_stream = stream  # ours while the graphs live
        log.info("captured %d CUDA graphs: %s", len(self.graphs), ", ".join(self.graphs))

    def _capture_or_fall_back(self) -> None:
        """Capture; a capture that fails leaves this runner eager (same kernels, same output), said in
        the log and in ``capture_error`` (the rank reports it: /server_info ``cuda_graph_error``).
        Every rank then agrees (``agree_on_graphs``) so that no rank replays while another runs eagerly."""
        try:
            self._capture_all()
        except RuntimeError as e:
            self.graphs.clear()
            self.use_graphs = False
            self.capture_error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            torch.cuda.synchronize(self.device)
            _end_generator_capture(self.device)
            log.error("CUDA graph capture failed (%s); running the static shapes eagerly "
                      "(--disable-cuda-graph behaviour; same output, slower)", self.capture_error)

    def agree_on_graphs(self, group=None) -> None:
        """At tp > 1: if any rank failed to capture, every rank runs eagerly (MIN over a CPU group)."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        ok = torch.tensor([1 if self.use_graphs or self.capture_error is None else 0])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if not int(ok) and self.use_graphs:
            self.graphs.clear()
            self.use_graphs = False
            self.capture_error = "another rank's CUDA graph capture failed"
            log.error("CUDA graphs off on this rank too: %s", self.capture_error)

    # ---- what the Decoder calls -----------------------------------------------------------------------
    def new_caches(self):
        self.tcache.length = 0
        if self.dcache is not None:
            self.dcache.length = 0
        return self.tcache, self.dcache

    def prefill(self, ids: torch.Tensor):
        """Eager (the prompt's length varies): the target over the prompt; returns logits, aux."""
        pos = self.arange[: ids.shape[1]]
        logits, aux = self.target.forward_static(ids, pos, self.tcache, self.capture_ids)
        self.tcache.length = ids.shape[1]
        return logits, aux

    def prefill_drafter(self, tokens: torch.Tensor, feats: torch.Tensor):
        pos = self.arange[: tokens.shape[1]]
        dl, dh = self.drafter.forward_static(tokens, feats, pos, self.dcache)
        self.dcache.length = tokens.shape[1]
        return dl, dh

    def decode(self, tok: torch.Tensor) -> torch.Tensor:
        b = self.bufs["decode"]
        b["ids"].copy_(tok)
        out = self.run("decode", self.tcache.length)
        self.tcache.length += 1
        return out["tok"].clone()

    def draft(self, first: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        b = self.bufs["draft"]
        drafts = [first]
        b["tok"].copy_(first.view(1, 1))
        b["h"].copy_(h)
        for _ in range(self.k - 1):
            out = self.run("draft", self.dcache.length)
            self.dcache.length += 1
            drafts.append(out["next"].clone())
            b["tok"].copy_(out["next"].view(1, 1))
            b["h"].copy_(out["h_out"])
        return torch.cat(drafts)

    def verify(self, last: torch.Tensor, draft: torch.Tensor, accept: int | None = None):
        """``accept``: forced acceptance (SGLANG_SIMULATE_ACC_LEN) -- commit this many drafts instead
        of the verified count; the verify itself runs (and is read) as always, so it costs the same."""
        b = self.bufs["verify"]
        base = self.tcache.length
        b["ids"][0, :1].copy_(last)
        b["ids"][0, 1:].copy_(draft)
        out = self.run("verify", base)
        a = int(out["accepted"])  # the one host read of a cycle
        if accept is not None:
            a = accept
        self.tcache.length = base + a + 1
        return a, out["pred"].clone(), out["aux"]  # pred's tokens are kept (committed): a copy

    def extend(self, new: torch.Tensor, feats: torch.Tensor, base: int):
        n = new.shape[0]
        b = self.bufs[f"extend{n}"]
        self.dcache.length = base
        b["ids"].copy_(new.view(1, n))
        b["feats"].copy_(feats)
        out = self.run(f"extend{n}", base)
        self.dcache.length = base + n
        return out["first"].clone(), out["h_out"].clone()


def _end_generator_capture(device) -> None:
    """A capture that raised in ``capture_end`` never ran the CUDA generators' capture epilogue: they
    still think they are capturing, and the process's next eager random op fails ("Offset increment
    outside graph capture encountered unexpectedly"). One empty capture runs prologue and epilogue."""
    try:
        with torch.cuda.device(device):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
    except RuntimeError as e:  # the eager fallback stands either way; only random ops are affected
        log.warning("could not reset the CUDA generators after the failed capture: %s", e)
