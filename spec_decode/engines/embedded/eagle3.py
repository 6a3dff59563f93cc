"""The EAGLE-3 drafter in SGLang 0.5.23's ``LlamaForCausalLMEagle3`` layout (see model.py's docstring)."""

from __future__ import annotations

import math

import torch
from torch import nn

from spec_decode.engines.embedded.kvcache import CacheRows, KVCache, StaticKVCache, causal_mask
from spec_decode.engines.embedded.layers import MLP, Attention, RMSNorm, register_rope
from spec_decode.engines.embedded.shapes import DrafterShape


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
        register_rope(self, shape)

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
            1,
            s.num_key_value_heads,
            max_len or s.max_position_embeddings,
            s.head_dim,
            device=self.lm_head.weight.device,
            dtype=self.lm_head.weight.dtype,
        )

    def _inputs(self, tokens: torch.Tensor, hidden: torch.Tensor, graph_ops: bool = False):
        """Step inputs: the fc is applied only to target features (3h wide), as in SGLang, and not
        to the drafter's own hidden state that later chain steps feed back (h wide)."""
        hidden = hidden.to(self.fc.weight.dtype)  # a no-op but for a bf16 drafter fed fp32 buffers (graphs.py)
        g = self.fc(hidden) if hidden.shape[-1] != self.shape.hidden_size else hidden
        layer = self.midlayer
        x = torch.cat(
            [
                layer.input_layernorm.static(self.embed_tokens(tokens), graph_ops),
                layer.hidden_norm.static(g, graph_ops),
            ],
            -1,
        )
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
        q, k, v = self.midlayer.self_attn.qkv(x, self.cos[start : start + t], self.sin[start : start + t])
        a = cache.attend(0, q, k, v, start, causal_mask(start, t, tokens.device))
        cache.length = start + t
        logits, h = self._finish(a, residual)
        return logits[0], h

    def new_static_cache(self, slots: int = 1) -> StaticKVCache:
        s = self.shape
        return StaticKVCache(
            1,
            s.num_key_value_heads,
            s.max_position_embeddings,
            s.head_dim,
            device=self.lm_head.weight.device,
            dtype=self.lm_head.weight.dtype,
            slots=slots,
        )

    graph_ops = False  # forward_static in fewer kernels (prepare_graph_ops)

    def prepare_graph_ops(self) -> Eagle3Drafter:
        """As LlamaTarget.prepare_graph_ops, for the drafter's static path."""
        self.midlayer.self_attn.prepare_graph_ops()
        self.cos_sin = torch.cat([self.cos, self.sin], dim=-1)
        self.graph_ops = True
        return self

    def forward_static(
        self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, cache: CacheRows, rot_rows: bool = True
    ):
        """``forward`` at the positions ``pos`` (T,), capturable (see LlamaTarget.forward_static, also for
        ``rot_rows``)."""
        g = self.graph_ops
        x, residual = self._inputs(tokens, hidden, g)
        attn = self.midlayer.self_attn
        if g and rot_rows:
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
