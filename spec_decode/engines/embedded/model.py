"""A tiny Llama target and an EAGLE-3 drafter, in the checkpoint layouts HF and SGLang load.

The target uses Hugging Face's `LlamaForCausalLM` names (``model.layers.0.self_attn.q_proj.weight``,
...), so ``transformers`` loads it offline. The drafter uses SGLang 0.5.23's ``LlamaForCausalLMEagle3``
layout: ``fc`` (3h -> h) over the concatenated hidden states of three target layers, one decoder layer
``midlayer.*`` whose attention reads ``[norm(embed); norm(hidden)]`` (2h wide), ``norm``, ``lm_head``,
``d2t``/``t2d``. The drafter shares the target's token embedding (SGLang does the same).

Layer-id convention (SGLang's): an aux layer id ``i`` means "the output of decoder layer i" (SGLang
captures the *input* of layer ``i + 1``), so valid ids are ``0 .. num_layers - 2``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from spec_decode.core.drafter import ARCHITECTURE, configured_layer_ids, default_layer_ids
from spec_decode.engines.embedded.parallel import TensorParallel, shard_units

TARGET_ARCH = "LlamaForCausalLM"
DRAFTER_ARCH = ARCHITECTURE  # spec_decode.core.drafter owns the drafter rules


@dataclass
class LlamaShape:
    """The config.json fields our models use (HF names)."""

    vocab_size: int = 256
    hidden_size: int = 192
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 6
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_config(cls, cfg: dict) -> LlamaShape:
        names = cls.__dataclass_fields__
        return cls(**{k: cfg[k] for k in names if k in cfg})


@dataclass
class DrafterShape(LlamaShape):
    num_hidden_layers: int = 1
    target_hidden_size: int = 192
    draft_vocab_size: int = 256
    aux_layer_ids: list[int] = field(default_factory=lambda: [1, 3, 4])


def target_config_json(shape: LlamaShape) -> dict:
    return {
        "architectures": [TARGET_ARCH],
        "model_type": "llama",
        **asdict(shape),
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }


def drafter_config_json(shape: DrafterShape) -> dict:
    base = asdict(shape)
    ids = base.pop("aux_layer_ids")
    return {
        "architectures": [DRAFTER_ARCH],
        "model_type": "llama",
        **base,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "num_aux_hidden_states": len(ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "torch_dtype": "float32",
    }


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def static(self, x: torch.Tensor, graph_ops: bool) -> torch.Tensor:
        """The static path's norm: with ``graph_ops``, torch's fused RMSNorm (one kernel on CUDA
        instead of pow/mean/add/rsqrt/mul/mul); rounding may differ from ``forward`` in the last bit."""
        if graph_ops:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self(x)


def rope_tables(head_dim: int, max_pos: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)  # HF's rotate_half layout
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rotate_half_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Projection rows (heads * head_dim, in) -> the rows whose output is rotate_half of theirs
    (``[-x2, x1]`` per head). With them appended to a q/k projection, one matmul yields q and its
    rotation, and RoPE is ``q * cos + q_rot * sin`` (2 kernels; apply_rope needs 5 per tensor)."""
    w = w.reshape(-1, head_dim, w.shape[-1])
    half = head_dim // 2
    return torch.cat([-w[:, half:], w[:, :half]], dim=1).reshape(-1, w.shape[-1])


def rope_graph(qk: torch.Tensor, qk_rot: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of (..., T, heads, head_dim) given its rotation; cos/sin (T, head_dim)."""
    return torch.addcmul(qk * cos[:, None], qk_rot, sin[:, None])


class Attention(nn.Module):
    def __init__(self, in_dim: int, shape: LlamaShape):
        super().__init__()
        hd, nh, nkv = shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(in_dim, nh * hd, bias=False)
        self.k_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.v_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, shape.hidden_size, bias=False)
        self._qkv: torch.Tensor | None = None  # fused weight for inference
        self._qkv_graph: torch.Tensor | None = None  # [q; k; v; rot(q); rot(k)] rows (prepare_graph_ops)
        self.u_qkv_graph: torch.Tensor | None = None  # the same per tp unit, columns (prepare_graph_ops)

    def fuse(self) -> None:
        self._qkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).detach()

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, T, in) -> q, k, v as (B, heads, T, head_dim) with RoPE applied to q and k."""
        b, t, _ = x.shape
        if self._qkv is not None:
            q, k, v = F.linear(x, self._qkv).split(
                [self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1
            )
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.nkv, self.hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, a: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = a.shape
        return self.o_proj(a.transpose(1, 2).reshape(b, t, self.nh * self.hd))

    # ---- the static (CUDA-graph) path's fewer-kernel variants, see LlamaTarget.prepare_graph_ops ---
    def prepare_graph_ops(self) -> None:
        """Projection weights with the rotate_half rows of q and k appended (per tp unit for the
        sharded target, whole for the drafter's fused ``_qkv``)."""
        hd, qk = self.hd, (self.nh + self.nkv) * self.hd
        if self._qkv is not None:
            self._qkv_graph = torch.cat([self._qkv, rotate_half_rows(self._qkv[:qk], hd)]).contiguous()
        if getattr(self, "u_qkv", None) is not None:
            n, qpu, kpu = self.local
            rows = self.u_qkv.transpose(1, 2)  # (units, c, in)
            w = rows[:, : (qpu + kpu) * hd]
            rot = rotate_half_rows(w, hd).view(n, -1, rows.shape[-1])
            self.u_qkv_graph = torch.cat([rows, rot], dim=1).transpose(1, 2).contiguous()

    def qkv_graph(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``qkv`` in 3 kernels (one matmul, RoPE of q and k together): strided views, not copies."""
        b, t, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        y = F.linear(x, self._qkv_graph)  # (B, T, [q k v rot(q) rot(k)])
        qk, c = (nh + nkv) * hd, (nh + 2 * nkv) * hd
        r = rope_graph(y[..., :qk].view(b, t, nh + nkv, hd), y[..., c:].view(b, t, nh + nkv, hd), cos, sin)
        v = y[..., qk:c].view(b, t, nkv, hd)
        return r[:, :, :nh].transpose(1, 2), r[:, :, nh:].transpose(1, 2), v.transpose(1, 2)

    def qkv_sharded_graph(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``qkv_sharded`` in 3 kernels (at one head per unit the head views need no copy)."""
        n, qpu, kpu = self.local
        t, hd = x.shape[1], self.hd
        y = torch.matmul(x, self.u_qkv_graph)  # (local units, T, [q k v rot(q) rot(k)])
        qk, c = (qpu + kpu) * hd, (qpu + 2 * kpu) * hd
        r = rope_graph(y[..., :qk].view(n, t, qpu + kpu, hd), y[..., c:].view(n, t, qpu + kpu, hd), cos, sin)

        def heads(z: torch.Tensor, per: int) -> torch.Tensor:  # (n, T, per, hd) -> (1, n * per, T, hd)
            return z.transpose(1, 2).reshape(1, n * per, t, hd)

        return heads(r[:, :, :qpu], qpu), heads(r[:, :, qpu:], kpu), heads(y[..., qk:c].view(n, t, kpu, hd), kpu)

    # ---- tensor-parallel inference (the target): per-unit weights, see parallel.py -------------------
    def shard(self, tp: TensorParallel) -> None:
        """This rank's units: q/k/v column-parallel (whole heads), o_proj row-parallel. At tp > 1
        the full projections are dropped (a rank holds 1/tp of them); at tp 1 they stay for
        ``forward_train`` (the drafter build trains against a loaded target)."""
        u, (lo, hi) = tp.units, tp.local_units
        qpu, kpu, hd = self.nh // u, self.nkv // u, self.hd
        qkv = torch.cat([self.q_proj.weight.view(u, qpu * hd, -1), self.k_proj.weight.view(u, kpu * hd, -1),
                         self.v_proj.weight.view(u, kpu * hd, -1)], dim=1)
        self.u_qkv = qkv[lo:hi].transpose(1, 2).contiguous().detach()  # (local units, in, c)
        o = self.o_proj.weight  # (h, heads * hd); head j is columns j*hd .. (j+1)*hd
        self.u_o = o.view(o.shape[0], u, qpu * hd).permute(1, 2, 0)[lo:hi].contiguous().detach()
        self.local = (hi - lo, qpu, kpu)
        if tp.size > 1:
            self.q_proj = self.k_proj = self.v_proj = self.o_proj = None

    def qkv_sharded(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (1, T, in) -> this rank's q (1, local heads, T, hd), k, v (1, local kv heads, T, hd)."""
        n, qpu, kpu = self.local
        t, hd = x.shape[1], self.hd
        y = torch.matmul(x, self.u_qkv)  # (local units, T, c): one matrix per unit
        q, k, v = y.split([qpu * hd, kpu * hd, kpu * hd], dim=-1)

        def heads(z: torch.Tensor, per: int) -> torch.Tensor:
            return z.view(n, t, per, hd).transpose(1, 2).reshape(1, n * per, t, hd)

        return apply_rope(heads(q, qpu), cos, sin), apply_rope(heads(k, kpu), cos, sin), heads(v, kpu)

    def out_partials(self, a: torch.Tensor) -> torch.Tensor:
        """a (1, local heads, T, hd) -> per-unit o_proj partials (local units, T, h)."""
        n, qpu, _ = self.local
        t = a.shape[2]
        return torch.bmm(a[0].view(n, qpu, t, self.hd).transpose(1, 2).reshape(n, t, qpu * self.hd), self.u_o)


class MLP(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        h, ff = shape.hidden_size, shape.intermediate_size
        self.gate_proj = nn.Linear(h, ff, bias=False)
        self.up_proj = nn.Linear(h, ff, bias=False)
        self.down_proj = nn.Linear(ff, h, bias=False)
        self._gate_up: torch.Tensor | None = None

    def fuse(self) -> None:
        self._gate_up = torch.cat([self.gate_proj.weight, self.up_proj.weight]).detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gate_up is not None:
            gate, up = F.linear(x, self._gate_up).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)

    def shard(self, tp: TensorParallel) -> None:
        """gate/up column-parallel, down_proj row-parallel, per unit of intermediate_size / units
        (full weights dropped at tp > 1, as in Attention.shard)."""
        u, (lo, hi) = tp.units, tp.local_units
        ff, h = self.gate_proj.weight.shape
        fpu = ff // u
        gate_up = torch.cat([self.gate_proj.weight.view(u, fpu, h), self.up_proj.weight.view(u, fpu, h)], dim=1)
        self.u_gate_up = gate_up[lo:hi].transpose(1, 2).contiguous().detach()  # (local units, h, 2 fpu)
        self.u_down = self.down_proj.weight.view(h, u, fpu).permute(1, 2, 0)[lo:hi].contiguous().detach()
        if tp.size > 1:
            self.gate_proj = self.up_proj = self.down_proj = None

    def partials(self, x: torch.Tensor) -> torch.Tensor:
        """x (1, T, h) -> per-unit down_proj partials (local units, T, h)."""
        gate, up = torch.matmul(x, self.u_gate_up).chunk(2, dim=-1)
        return torch.bmm(F.silu(gate) * up, self.u_down)


class KVCache:
    """Preallocated per-layer K/V for batch 1. Rolling back only lowers ``length``: attention reads
    ``[:length]``, so stale slots beyond it are never seen and are overwritten by the next write."""

    def __init__(self, layers: int, kv_heads: int, max_len: int, head_dim: int, device=None):
        self.k = torch.zeros(layers, 1, kv_heads, max_len, head_dim, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len
        self.length = 0

    def crop(self, n: int) -> None:
        self.length = n

    def attend(self, layer: int, q, k, v, start: int, mask) -> torch.Tensor:
        end = start + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return F.scaled_dot_product_attention(
            q, self.k[layer, :, :, :end], self.v[layer, :, :, :end], attn_mask=mask,
            enable_gqa=q.shape[1] != k.shape[1],
        )


PV_SPLIT = 8  # slot chunks of the static path's multi-query P @ V ("bmm" attention, T > 1)


class StaticKVCache:
    """The KV cache of the CUDA-graph path: every shape fixed, positions given as a device tensor.
    New K/V are written at ``pos`` with ``index_copy_``; attention always reads all ``max_len`` slots
    under a mask ``key <= pos`` (a slot beyond a query's position, stale or empty, is never seen).
    ``length`` is host bookkeeping only, as in KVCache: rolling back lowers it."""

    def __init__(self, layers: int, kv_heads: int, max_len: int, head_dim: int, device=None):
        self.k = torch.zeros(layers, 1, kv_heads, max_len, head_dim, device=device)
        self.v = torch.zeros_like(self.k)
        self.keys = torch.arange(max_len, device=device)
        self.max_len = max_len
        self.length = 0
        self.mask_table: torch.Tensor | None = None  # (max_len, max_len) additive, prepare_graph_ops
        self.attention = "sdpa"  # or "bmm" (prepare_graph_ops)

    def crop(self, n: int) -> None:
        self.length = n

    def prepare_graph_ops(self, attention: str = "sdpa") -> None:
        """Fewer kernels per step: the additive mask of every position precomputed (one gather per
        forward instead of a compare per forward plus SDPA's bool-to-float conversion per layer), and
        ``attention`` "bmm" = baddbmm(mask, q, k^T) + softmax + bmm (3 kernels) instead of SDPA."""
        if attention not in ("sdpa", "bmm"):
            raise ValueError(f"attention must be 'sdpa' or 'bmm', not {attention!r}")
        keys = self.keys.to(torch.float32)
        self.mask_table = torch.zeros(self.max_len, self.max_len, device=self.k.device).masked_fill(
            keys[None, :] > keys[:, None], float("-inf"))
        self.attention = attention

    def mask(self, pos: torch.Tensor) -> torch.Tensor:
        if self.mask_table is not None:
            return self.mask_table.index_select(0, pos)  # (T, max_len): 0 or -inf
        return self.keys[None, :] <= pos[:, None]  # (T, max_len)

    def attend(self, layer: int, q, k, v, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.k[layer].index_copy_(2, pos, k)
        self.v[layer].index_copy_(2, pos, v)
        if self.attention == "bmm" and q.shape[1] == k.shape[1]:
            keys, values = self.k[layer][0], self.v[layer][0]  # (heads, max_len, hd)
            scores = torch.baddbmm(mask, q[0], keys.transpose(1, 2), alpha=q.shape[-1] ** -0.5)
            p = torch.softmax(scores, -1)
            h, t, slots = p.shape
            if t == 1 or slots % PV_SPLIT:
                return torch.bmm(p, values)[None]
            # T > 1: cuBLAS runs (heads, T, slots) @ (heads, slots, hd) as one small tile per head
            # looping over all slots; PV_SPLIT * heads products over slots / PV_SPLIT, then a sum,
            # took 2/3 of the time on an H200 (benchmarks/gpu/engine_profile.py --attention-micro).
            chunk = slots // PV_SPLIT
            pp = p.view(h, t, PV_SPLIT, chunk).transpose(1, 2).reshape(h * PV_SPLIT, t, chunk)
            part = torch.bmm(pp, values.reshape(h * PV_SPLIT, chunk, values.shape[-1]))
            return part.view(h, PV_SPLIT, t, -1).sum(1)[None]
        return F.scaled_dot_product_attention(q, self.k[layer], self.v[layer], attn_mask=mask,
                                              enable_gqa=q.shape[1] != k.shape[1])


def causal_mask(start: int, t: int, device=None) -> torch.Tensor | None:
    """Query i (at position start+i) sees keys at positions <= start+i. SDPA's ``is_causal`` aligns
    its mask to the top-left corner, which is wrong for a multi-token step on a non-empty cache."""
    if t == 1:
        return None
    keys = torch.arange(start + t, device=device)
    queries = torch.arange(start, start + t, device=device)
    return keys[None, :] <= queries[:, None]


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
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class LlamaTarget(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.shape = shape
        self.model = LlamaBody(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        cos, sin = rope_tables(shape.head_dim, shape.max_position_embeddings, shape.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
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
            s.num_hidden_layers, kv_heads, max_len or s.max_position_embeddings,
            s.head_dim, device=self.lm_head.weight.device,
        )

    def new_static_cache(self) -> StaticKVCache:
        s = self.shape
        return StaticKVCache(s.num_hidden_layers, s.num_key_value_heads // self.tp.size,
                             s.max_position_embeddings, s.head_dim, device=self.lm_head.weight.device)

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

    def forward_static(self, ids: torch.Tensor, pos: torch.Tensor, cache: StaticKVCache,
                       capture: list[int] | None = None):
        """``forward`` with no host value in it (CUDA-graph capturable): (1, T) tokens at the
        positions ``pos`` (T,). Returns logits (T, V) and the captured features or None; the caller
        moves ``cache.length``."""
        t, g = ids.shape[1], self.graph_ops
        if g:
            cos, sin = self.cos_sin.index_select(0, pos).chunk(2, dim=-1)
        else:
            cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = cache.mask(pos)
        x = self.model.embed_tokens(ids)
        outs = {}
        reduce = self.tp.reduce
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            qkv = attn.qkv_sharded_graph if g else attn.qkv_sharded
            q, k, v = qkv(layer.input_layernorm.static(x, g), cos, sin)
            x = x + reduce(attn.out_partials(cache.attend(i, q, k, v, pos, mask))).view(1, t, -1)
            x = x + reduce(layer.mlp.partials(layer.post_attention_layernorm.static(x, g))).view(1, t, -1)
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


# --------------------------------------------------------------------------- drafter


class Eagle3Layer(nn.Module):
    """SGLang's EAGLE-3 midlayer: attention over [input_layernorm(embed); hidden_norm(hidden)]."""

    def __init__(self, shape: DrafterShape):
        super().__init__()
        h = shape.hidden_size
        self.input_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, shape.rms_norm_eps)
        self.self_attn = Attention(2 * h, shape)
        self.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.mlp = MLP(shape)


class Eagle3Drafter(nn.Module):
    def __init__(self, shape: DrafterShape, embed_tokens: nn.Embedding):
        super().__init__()
        self.shape = shape
        h = shape.hidden_size
        self.fc = nn.Linear(len(shape.aux_layer_ids) * shape.target_hidden_size, h, bias=False)
        self.midlayer = Eagle3Layer(shape)
        self.norm = RMSNorm(h, shape.rms_norm_eps)
        self.lm_head = nn.Linear(h, shape.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(shape.vocab_size, dtype=torch.bool))
        # Shared with the target, never saved with the drafter (SGLang: set_embed).
        self._embed = [embed_tokens]
        cos, sin = rope_tables(shape.head_dim, shape.max_position_embeddings, shape.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._embed[0]

    def prepare_inference(self) -> Eagle3Drafter:
        self.eval()
        self.midlayer.self_attn.fuse()
        self.midlayer.mlp.fuse()
        return self

    def new_cache(self, max_len: int | None = None) -> KVCache:
        s = self.shape
        return KVCache(
            1, s.num_key_value_heads, max_len or s.max_position_embeddings, s.head_dim,
            device=self.lm_head.weight.device,
        )

    def _inputs(self, tokens: torch.Tensor, hidden: torch.Tensor, graph_ops: bool = False):
        """Step inputs: the fc is applied only to target features (3h wide), as in SGLang, and not
        to the drafter's own hidden state that later chain steps feed back (h wide)."""
        g = self.fc(hidden) if hidden.shape[-1] != self.shape.hidden_size else hidden
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm.static(self.embed_tokens(tokens), graph_ops),
                       layer.hidden_norm.static(g, graph_ops)], -1)
        return x, g

    def _finish(self, attn_out: torch.Tensor, residual: torch.Tensor, graph_ops: bool = False):
        layer = self.midlayer
        residual = layer.self_attn.out(attn_out) + residual
        residual = layer.mlp(layer.post_attention_layernorm.static(residual, graph_ops)) + residual
        return self.lm_head(self.norm.static(residual, graph_ops)), residual

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache):
        """Incremental step over (1, T) positions starting at cache.length. Returns draft-vocab
        logits (T, Vd) and the pre-norm hidden state (1, T, h) that the next chain step reads."""
        start, t = cache.length, tokens.shape[1]
        x, residual = self._inputs(tokens, hidden)
        q, k, v = self.midlayer.self_attn.qkv(
            x, self.cos[start : start + t], self.sin[start : start + t]
        )
        a = cache.attend(0, q, k, v, start, causal_mask(start, t, tokens.device))
        cache.length = start + t
        logits, h = self._finish(a, residual)
        return logits[0], h

    def new_static_cache(self) -> StaticKVCache:
        s = self.shape
        return StaticKVCache(1, s.num_key_value_heads, s.max_position_embeddings, s.head_dim,
                             device=self.lm_head.weight.device)

    graph_ops = False  # forward_static in fewer kernels (prepare_graph_ops)

    def prepare_graph_ops(self) -> Eagle3Drafter:
        """As LlamaTarget.prepare_graph_ops, for the drafter's static path."""
        self.midlayer.self_attn.prepare_graph_ops()
        self.cos_sin = torch.cat([self.cos, self.sin], dim=-1)
        self.graph_ops = True
        return self

    def forward_static(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor,
                       cache: StaticKVCache):
        """``forward`` at the positions ``pos`` (T,), capturable (see LlamaTarget.forward_static)."""
        g = self.graph_ops
        x, residual = self._inputs(tokens, hidden, g)
        attn = self.midlayer.self_attn
        if g:
            q, k, v = attn.qkv_graph(x, *self.cos_sin.index_select(0, pos).chunk(2, dim=-1))
        else:
            q, k, v = attn.qkv(x, self.cos.index_select(0, pos), self.sin.index_select(0, pos))
        a = cache.attend(0, q, k, v, pos, cache.mask(pos))
        logits, h = self._finish(a, residual, g)
        return logits[0], h

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        # index_select, not d2t[ids]: indexing by a 0-d CUDA tensor reads it on the host (a sync),
        # which CUDA-graph capture refuses (seen on the H200).
        return draft_ids + self.d2t.index_select(0, draft_ids.reshape(-1)).reshape(draft_ids.shape)

    # ---- EAGLE-3 training-time test: several unrolled steps in one pass --------------------------
    def ttt_logits(self, tokens: torch.Tensor, feats: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """tokens (B, T): the token sequence; feats (B, T, 3h): target features at each position.

        Chain t (one per position) starts with step 1 at position t reading (embed(x[t+1]), fc(f[t]))
        and predicting x[t+2]. Step j sits at position t+j-1, reads (embed(x[t+j]), own hidden of step
        j-1) and attends to step-1 keys at positions <= t plus its own chain's keys of steps 2..j --
        exactly what the incremental cache holds at inference. Returns per-step logits (B, C, Vd)
        over the C = T-1 chains; positions past the end read token 0 and must be masked by the loss.
        """
        b, t = tokens.shape
        c = t - 1
        att = self.midlayer.self_attn
        scale = 1.0 / math.sqrt(att.hd)
        causal = torch.ones(c, c, dtype=torch.bool, device=tokens.device).tril()
        hidden = feats[:, :c]
        k1 = v1 = None
        extra_k: list[torch.Tensor] = []
        extra_v: list[torch.Tensor] = []
        out = []
        for j in range(1, steps + 1):
            tok = torch.zeros(b, c, dtype=tokens.dtype, device=tokens.device)
            n = max(0, t - j)  # chains whose input token x[t'+j] exists
            tok[:, :n] = tokens[:, j : j + n]
            x, residual = self._inputs(tok, hidden)
            pos = slice(j - 1, j - 1 + c)
            q, k, v = att.qkv(x, self.cos[pos], self.sin[pos])
            if j == 1:
                k1, v1 = k, v
                scores = (q @ k1.transpose(-1, -2)) * scale
                scores = scores.masked_fill(~causal, float("-inf"))
                a = torch.softmax(scores, -1) @ v1
            else:
                extra_k.append(k)
                extra_v.append(v)
                s1 = ((q @ k1.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
                sx = torch.stack([(q * kk).sum(-1) * scale for kk in extra_k], dim=-1)
                p = torch.softmax(torch.cat([s1, sx], -1), -1)
                a = p[..., :c] @ v1
                for i, vv in enumerate(extra_v):
                    a = a + p[..., c + i : c + i + 1] * vv
            logits, hidden = self._finish(a, residual)
            out.append(logits)
        return out


# --------------------------------------------------------------------------- loading


def load_target(model_dir: str | Path, device: str = "cpu", tp: TensorParallel | None = None) -> LlamaTarget:
    """The target ready for inference; with ``tp``, only this rank's shard of each layer is kept."""
    from safetensors.torch import load_file

    cfg = read_config(model_dir)
    model = LlamaTarget(LlamaShape.from_config(cfg))
    model.load_state_dict(load_file(str(Path(model_dir) / "model.safetensors")))
    return model.to(device).prepare_inference(tp)


def drafter_shape_from_config(cfg: dict) -> DrafterShape:
    ids = configured_layer_ids(cfg)
    shape = DrafterShape(**{k: cfg[k] for k in LlamaShape.__dataclass_fields__ if k in cfg})
    shape.target_hidden_size = cfg.get("target_hidden_size", shape.hidden_size)
    shape.draft_vocab_size = cfg.get("draft_vocab_size", shape.vocab_size)
    if ids is not None:
        shape.aux_layer_ids = list(ids)
    return shape


def load_drafter(model_dir: str | Path, target: LlamaTarget, device: str = "cpu") -> Eagle3Drafter:
    from safetensors.torch import load_file

    cfg = read_config(model_dir)
    shape = drafter_shape_from_config(cfg)
    if configured_layer_ids(cfg) is None:
        shape.aux_layer_ids = default_layer_ids(target.shape.num_hidden_layers)  # SGLang's default capture
    model = Eagle3Drafter(shape, target.model.embed_tokens)
    model.load_state_dict(load_file(str(Path(model_dir) / "model.safetensors")))
    return model.to(device).prepare_inference()
