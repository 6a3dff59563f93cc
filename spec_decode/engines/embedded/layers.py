"""The building blocks of the target and the drafter: RMSNorm, RoPE, attention projections, MLP.

Each block has three paths: the plain one (training, the drafter), the tensor-parallel one (per-unit
weights, ``shard``) and the static CUDA-graph one with fewer kernels (``prepare_graph_ops``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spec_decode.engines.embedded.parallel import TensorParallel
from spec_decode.engines.embedded.shapes import LlamaShape


def embedding(num: int, dim: int) -> nn.Embedding:
    """``nn.Embedding(num, dim)``, initialised as torch initialises it (``normal_``, the same draws in the
    same order), except on the meta device (the loaders build there, then assign the checkpoint): torch's
    own init of a meta tensor runs a reference decomposition that imports ``torch._dynamo``, 1.3-1.7 s of
    CPU in every rank that never compiles (docs/testing.md)."""
    emb = nn.Embedding(num, dim, _weight=torch.empty(num, dim))
    if not emb.weight.is_meta:
        with torch.no_grad():
            emb.weight.normal_()
    return emb


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


def register_rope(module: nn.Module, shape: LlamaShape, device=None, dtype: torch.dtype = torch.float32) -> None:
    """The module's (non-persistent) ``cos``/``sin`` buffers, computed in fp32 and stored in the
    weights' dtype (a bf16 model's RoPE runs in bf16). Called again after a meta-device load; built on
    the meta device (the loaders), they are meta placeholders until then: computing them there would run
    torch's reference decompositions, which import ``torch._dynamo`` (1.3-1.7 s of CPU in every rank)."""
    if torch.device(device or torch.get_default_device()).type == "meta":
        size = (shape.max_position_embeddings, shape.head_dim)
        module.register_buffer("cos", torch.empty(size, device="meta", dtype=dtype), persistent=False)
        module.register_buffer("sin", torch.empty(size, device="meta", dtype=dtype), persistent=False)
        return
    cos, sin = rope_tables(shape.head_dim, shape.max_position_embeddings, shape.rope_theta)
    module.register_buffer("cos", cos.to(device=device, dtype=dtype), persistent=False)
    module.register_buffer("sin", sin.to(device=device, dtype=dtype), persistent=False)


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


def spread_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """x (1, T, in) as (n, T, in), a copy per unit, for a per-unit bmm. torch.matmul broadcasts x (batch
    stride 0), and ATen's CUDA bmm then copies it contiguous in a kernel of its own: by their count, the two
    copy kernels a layer (145 us of the 8B-shaped compiled decode step). Written here, the copy is
    inductor's to fuse into the RMSNorm kernel that makes x."""
    return x.expand(n, *x.shape[1:]).contiguous()


def split_k(x: torch.Tensor, w: torch.Tensor, s: int) -> torch.Tensor:
    """x (T, K) @ w (K, N) as ``s`` partial products over consecutive K chunks, (s, T, N) in fp32: one
    batched GEMM (bf16/fp16 on CUDA: its fp32 output directly, ``bmm(out_dtype=)``), whose sum over the first
    dim is the product. K must divide by s."""
    t, k = x.shape
    xs = x.view(t, s, k // s).transpose(0, 1)  # (s, T, K/s)
    ws = w.view(s, k // s, w.shape[1])
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        return torch.bmm(xs, ws, out_dtype=torch.float32)
    return torch.bmm(xs, ws).float()


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
            q, k, v = F.linear(x, self._qkv).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
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
        qkv = torch.cat(
            [
                self.q_proj.weight.view(u, qpu * hd, -1),
                self.k_proj.weight.view(u, kpu * hd, -1),
                self.v_proj.weight.view(u, kpu * hd, -1),
            ],
            dim=1,
        )
        self.u_qkv = qkv[lo:hi].transpose(1, 2).contiguous().detach()  # (local units, in, c)
        o = self.o_proj.weight  # (h, heads * hd); head j is columns j*hd .. (j+1)*hd
        self.u_o = o.view(o.shape[0], u, qpu * hd).permute(1, 2, 0)[lo:hi].contiguous().detach()
        self.local = (hi - lo, qpu, kpu)
        if tp.size > 1:
            self.q_proj = self.k_proj = self.v_proj = self.o_proj = None

    def qkv_sharded(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spread: bool = False):
        """x (1, T, in) -> this rank's q (1, local heads, T, hd), k, v (1, local kv heads, T, hd).
        ``spread`` (under torch.compile): the same products, x copied per unit by us (see spread_rows)."""
        n, qpu, kpu = self.local
        t, hd = x.shape[1], self.hd
        y = torch.bmm(spread_rows(x, n), self.u_qkv) if spread else torch.matmul(x, self.u_qkv)  # (units, T, c)
        q, k, v = y.split([qpu * hd, kpu * hd, kpu * hd], dim=-1)

        def heads(z: torch.Tensor, per: int) -> torch.Tensor:
            return z.view(n, t, per, hd).transpose(1, 2).reshape(1, n * per, t, hd)

        return apply_rope(heads(q, qpu), cos, sin), apply_rope(heads(k, kpu), cos, sin), heads(v, kpu)

    def out_dense(self, a: torch.Tensor) -> torch.Tensor:
        """a (1, local heads, T, hd) -> o_proj (T, h) in one GEMM over the units (their sum in the GEMM's
        fp32 accumulator, not ``out_partials`` + a tree sum): the per-unit weights viewed as one matrix,
        units stacked along its input, heads in order. tp 1 under torch.compile (other rounding)."""
        x, w = self._out_operands(a)
        return x @ w

    def out_split(self, a: torch.Tensor, s: int) -> torch.Tensor:
        """``out_dense`` as ``s`` fp32 partials (s, T, h) over consecutive chunks of its input (split_k, see
        ``split_k``): the caller's sum of them is left to inductor, to fuse into the residual add and the next
        norm instead of cuBLAS's own split-K reduce kernel. A variant of the compiled tp-1 path."""
        return split_k(*self._out_operands(a), s)

    def _out_operands(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """o_proj's (T, units x heads x hd) input and its (units x heads x hd, h) weight, units stacked."""
        n, qpu, _ = self.local
        k = n * qpu * self.hd
        return a[0].transpose(0, 1).reshape(a.shape[2], k), self.u_o.view(k, -1)

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

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """x (1, T, h) -> the MLP's output (T, h), down_proj in one GEMM over the units (as
        Attention.out_dense); gate/up on x spread per unit (spread_rows)."""
        act, w = self._down_operands(x)
        return act @ w

    def split(self, x: torch.Tensor, s: int) -> torch.Tensor:
        """``dense`` with down_proj as ``s`` fp32 partials (s, T, h) (``split_k``; Attention.out_split)."""
        return split_k(*self._down_operands(x), s)

    def _down_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """down_proj's (T, units x fpu) input (gate/up on x spread per unit, then SiLU x up) and its weight."""
        gate, up = torch.bmm(spread_rows(x, self.u_gate_up.shape[0]), self.u_gate_up).chunk(2, dim=-1)
        n, t, fpu = gate.shape
        return (F.silu(gate) * up).transpose(0, 1).reshape(t, n * fpu), self.u_down.view(n * fpu, -1)

    def partials(self, x: torch.Tensor) -> torch.Tensor:
        """x (1, T, h) -> per-unit down_proj partials (local units, T, h)."""
        gate, up = torch.matmul(x, self.u_gate_up).chunk(2, dim=-1)
        return torch.bmm(F.silu(gate) * up, self.u_down)
