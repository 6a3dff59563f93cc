"""A tiny Llama target and an EAGLE-3 drafter, in the checkpoint layouts HF and SGLang load.

The target uses Hugging Face's `LlamaForCausalLM` names (``model.layers.0.self_attn.q_proj.weight``,
...), so ``transformers`` loads it offline. The drafter uses SGLang 0.5.23's ``LlamaForCausalLMEagle3``
layout: ``fc`` (3h -> h) over the concatenated hidden states of three target layers, one decoder layer
``midlayer.*`` whose attention reads ``[norm(embed); norm(hidden)]`` (2h wide), ``norm``, ``lm_head``,
``d2t``/``t2d``. The drafter shares the target's token embedding (SGLang does the same).

Layer-id convention (SGLang's): an aux layer id ``i`` means "the output of decoder layer i" (SGLang
captures the *input* of layer ``i + 1``), so valid ids are ``0 .. num_layers - 2``.

The pieces: ``shapes`` (shapes, config.json), ``layers`` (norm, RoPE, attention, MLP), ``kvcache``,
``eagle3`` (the drafter); this module holds the target and the loaders, and re-exports the pieces'
public names so ``from spec_decode.engines.embedded.model import ...`` keeps working.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from spec_decode.core.drafter import configured_layer_ids, default_layer_ids
from spec_decode.engines.embedded.eagle3 import Eagle3Drafter, Eagle3Layer
from spec_decode.engines.embedded.kvcache import (
    PV_SPLIT,
    CacheRows,
    KVCache,
    StaticKVCache,
    causal_mask,
)
from spec_decode.engines.embedded.layers import (
    MLP,
    Attention,
    RMSNorm,
    apply_rope,
    embedding,
    register_rope,
    rope_graph,
    rope_tables,
    rotate_half_rows,
)
from spec_decode.engines.embedded.parallel import TensorParallel, shard_units
from spec_decode.engines.embedded.shapes import (
    DRAFTER_ARCH,
    TARGET_ARCH,
    DrafterShape,
    LlamaShape,
    drafter_config_json,
    drafter_shape_from_config,
    read_config,
    target_config_json,
)

__all__ = [
    "DRAFTER_ARCH",
    "MLP",
    "PV_SPLIT",
    "CacheRows",
    "TARGET_ARCH",
    "Attention",
    "DecoderLayer",
    "DrafterShape",
    "Eagle3Drafter",
    "Eagle3Layer",
    "KVCache",
    "LlamaBody",
    "LlamaShape",
    "LlamaTarget",
    "RMSNorm",
    "StaticKVCache",
    "apply_rope",
    "register_rope",
    "causal_mask",
    "drafter_config_json",
    "drafter_shape_from_config",
    "load_drafter",
    "load_target",
    "read_config",
    "rope_graph",
    "rope_tables",
    "rotate_half_rows",
    "target_config_json",
]


# --------------------------------------------------------------------------- target


class DecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = Attention(shape.hidden_size, shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)


class LlamaBody(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.embed_tokens = embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class LlamaTarget(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.shape = shape
        self.model = LlamaBody(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        register_rope(self, shape)
        self.tp: TensorParallel | None = None  # set by prepare_inference

    @property
    def shard_units(self) -> int:
        s = self.shape
        return shard_units(s.num_attention_heads, s.num_key_value_heads, s.intermediate_size)

    def prepare_inference(self, tp: TensorParallel | None = None) -> LlamaTarget:
        """Inference layout: this rank's shard of every layer (all of it at tp 1), in per-unit
        weights; embedding, norms and lm_head stay whole (replicated on every rank)."""
        self.eval()
        self.tp = tp or TensorParallel(units=self.shard_units)
        if self.tp.units != self.shard_units:
            raise ValueError(f"tp units {self.tp.units} != the target's {self.shard_units}")
        for layer in self.model.layers:
            layer.self_attn.shard(self.tp)
            layer.mlp.shard(self.tp)
        return self

    def new_cache(self, max_len: int | None = None) -> KVCache:
        s = self.shape
        kv_heads = s.num_key_value_heads // (self.tp.size if self.tp else 1)
        return KVCache(
            s.num_hidden_layers,
            kv_heads,
            max_len or s.max_position_embeddings,
            s.head_dim,
            device=self.lm_head.weight.device,
            dtype=self.lm_head.weight.dtype,
        )

    def new_static_cache(self, slots: int = 1) -> StaticKVCache:
        s = self.shape
        return StaticKVCache(
            s.num_hidden_layers,
            s.num_key_value_heads // self.tp.size,
            s.max_position_embeddings,
            s.head_dim,
            device=self.lm_head.weight.device,
            dtype=self.lm_head.weight.dtype,
            slots=slots,
        )

    graph_ops = False  # forward_static in fewer kernels (prepare_graph_ops)

    def prepare_graph_ops(self) -> LlamaTarget:
        """``forward_static`` with fewer kernels per step, for the CUDA path (graphs.StaticRunner), where a
        decode step of this tiny model is bound by the count of kernels, not by their work: fused
        RMSNorm, RoPE from rotated projection rows, cos/sin gathered in one kernel. Same function, other
        rounding: tokens equal ``forward``'s except on near-ties (the CPU path never sets this)."""
        for layer in self.model.layers:
            layer.self_attn.prepare_graph_ops()
        self.cos_sin = torch.cat([self.cos, self.sin], dim=-1)
        self.graph_ops = True
        return self

    def forward_static(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: CacheRows,
        capture: list[int] | None = None,
        rot_rows: bool = True,
        dense: bool = False,
        split: int = 0,
    ):
        """``forward`` with no host value in it (CUDA-graph capturable): (1, T) tokens at the
        positions ``pos`` (T,), T = B rows x cache.t tokens packed row after row (``cache`` is a
        StaticKVCache's ``rows`` view: each row attends over its own slot). Returns logits (T, V) and
        the captured features or None; the caller keeps the lengths. ``rot_rows`` False (graph_ops
        under torch.compile): RoPE from the plain q/k, which inductor fuses into one kernel, instead of
        the rotated rows' extra weights (a third more of the q/k/v bytes read per step). ``dense`` (tp 1
        under torch.compile): o_proj and down_proj as one GEMM each over the units instead of per-unit
        partials and the tree sum (12.9 against 16.8 us for o, 32.0 against 36.0 us for down on the 8B
        shape, H200; benchmarks/gpu/real_shape.py --gemm-micro): other rounding, so tp 1 only, where no
        tp size has to match it bit for bit; and the per-unit q/k/v and gate/up products on x copied per
        unit by us (layers.spread_rows), not broadcast. ``split`` > 1 (with ``dense``; a variant for
        benchmarks/gpu/real_shape.py --proj-split until measured): o_proj and down_proj as that many fp32
        partials whose sum inductor fuses into the residual add and the next norm (layers.split_k), in place
        of cuBLAS's split-K reduce kernel after each (64 a step on the 8B shape, ~110 us on an H200)."""
        t, g = ids.shape[1], self.graph_ops
        if g:
            cos, sin = self.cos_sin.index_select(0, pos).chunk(2, dim=-1)
        else:
            cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = cache.mask(pos)
        x = self.model.embed_tokens(ids)
        outs = {}
        reduce = self.tp.reduce
        dense = dense and self.tp.size == 1
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            xn = layer.input_layernorm.static(x, g)
            if g and rot_rows:
                q, k, v = attn.qkv_sharded_graph(xn, cos, sin)
            else:
                q, k, v = attn.qkv_sharded(xn, cos, sin, spread=dense)
            a = cache.attend(i, q, k, v, pos, mask)
            if dense and split > 1:  # the partials' sum, for inductor to read inside the next norm
                o = attn.out_split(a, split).sum(0).to(x.dtype)
            else:
                o = attn.out_dense(a) if dense else reduce(attn.out_partials(a))
            x = x + o.view(1, t, -1)
            h = layer.post_attention_layernorm.static(x, g)
            if dense and split > 1:
                o = layer.mlp.split(h, split).sum(0).to(x.dtype)
            else:
                o = layer.mlp.dense(h) if dense else reduce(layer.mlp.partials(h))
            x = x + o.view(1, t, -1)
            if capture and i in capture:
                outs[i] = x
        logits = self.lm_head(self.model.norm.static(x, g))[0]
        aux = torch.cat([outs[i] for i in capture], dim=-1) if capture else None
        return logits, aux

    def forward_train(self, ids: torch.Tensor, capture: list[int] | None = None):
        """Full causal forward over (B, T). Returns logits (B, T, V) and the captured layer outputs
        concatenated (B, T, len(capture) * h), or None."""
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.model.embed_tokens(ids)
        outs = {}
        for i, layer in enumerate(self.model.layers):
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(x), cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + layer.self_attn.out(a)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if capture and i in capture:
                outs[i] = x
        logits = self.lm_head(self.model.norm(x))
        # The order of ids matters: it is the order of the fc's input blocks.
        aux = torch.cat([outs[i] for i in capture], dim=-1) if capture else None
        return logits, aux

    def forward(self, ids: torch.Tensor, cache: KVCache, capture: list[int] | None = None):
        """Incremental forward of (1, T) new tokens at positions cache.length.. ; appends to cache.
        Returns logits (T, V) and the captured hidden states (1, T, len(capture) * h) or None."""
        start, t = cache.length, ids.shape[1]
        if start + t > cache.max_len:
            raise ValueError(f"sequence of {start + t} tokens exceeds the context of {cache.max_len}")
        cos, sin = self.cos[start : start + t], self.sin[start : start + t]
        mask = causal_mask(start, t, ids.device)
        x = self.model.embed_tokens(ids)
        outs = {}
        reduce = self.tp.reduce  # row-parallel partials -> (T, h), the same at every tp size
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            q, k, v = attn.qkv_sharded(layer.input_layernorm(x), cos, sin)
            x = x + reduce(attn.out_partials(cache.attend(i, q, k, v, start, mask))).view(1, t, -1)
            x = x + reduce(layer.mlp.partials(layer.post_attention_layernorm(x))).view(1, t, -1)
            if capture and i in capture:
                outs[i] = x
        cache.length = start + t
        logits = self.lm_head(self.model.norm(x))[0]
        aux = torch.cat([outs[i] for i in capture], dim=-1) if capture else None
        return logits, aux


# --------------------------------------------------------------------------- loading


def _load(model: nn.Module, model_dir: str | Path, device) -> None:
    """The checkpoint's tensors become the module's (``assign``): built on the meta device, nothing is
    initialised or copied twice (an 8B target loads in seconds), and the checkpoint's dtype is the
    model's (a bf16 synthetic target stays bf16; the tiny models are fp32)."""

    model.load_state_dict(load_file(str(Path(model_dir) / "model.safetensors"), device=str(device)), assign=True)
    register_rope(model, model.shape, device, model.lm_head.weight.dtype)


def load_target(model_dir: str | Path, device: str = "cpu", tp: TensorParallel | None = None) -> LlamaTarget:
    """The target ready for inference; with ``tp``, only this rank's shard of each layer is kept."""
    cfg = read_config(model_dir)
    with torch.device("meta"):
        model = LlamaTarget(LlamaShape.from_config(cfg))
    _load(model, model_dir, device)
    return model.prepare_inference(tp)


def load_drafter(model_dir: str | Path, target: LlamaTarget, device: str = "cpu") -> Eagle3Drafter:
    cfg = read_config(model_dir)
    shape = drafter_shape_from_config(cfg)
    if configured_layer_ids(cfg) is None:
        shape.aux_layer_ids = default_layer_ids(target.shape.num_hidden_layers)  # SGLang's default capture
    with torch.device("meta"):
        model = Eagle3Drafter(shape, target.model.embed_tokens)
    _load(model, model_dir, device)
    return model.prepare_inference()
