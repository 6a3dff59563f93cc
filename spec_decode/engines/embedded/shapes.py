"""The shapes of our Llama target and EAGLE-3 drafter, and their config.json (HF field names).

The checkpoint layouts themselves are described in model.py; the layer-id rules live in
``spec_decode.core.drafter``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spec_decode.core.drafter import ARCHITECTURE, configured_layer_ids

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


def drafter_shape_from_config(cfg: dict) -> DrafterShape:
    ids = configured_layer_ids(cfg)
    shape = DrafterShape(**{k: cfg[k] for k in LlamaShape.__dataclass_fields__ if k in cfg})
    shape.target_hidden_size = cfg.get("target_hidden_size", shape.hidden_size)
    shape.draft_vocab_size = cfg.get("draft_vocab_size", shape.vocab_size)
    if ids is not None:
        shape.aux_layer_ids = list(ids)
    return shape
