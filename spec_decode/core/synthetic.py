"""Synthetic targets and drafters: a real model's shape with seeded random weights (issue 31).

The cost of a decode step does not depend on the weights' values, so a Llama-family target of a real
shape with random bf16 weights, driven with forced acceptance (``spec.simulate_accept_len``), measures
the system side of speculative decoding at that shape: cycle length, all-reduce payloads, verify
share. Its outputs mean nothing, so every speculative job on one is forced (preflight) and labelled
performance-only (``record.results.performance_only``).

The versioned input is the shape and the seed (``model.synthetic`` in conf/model/<name>.yaml,
``drafter.synthetic`` in conf/drafter/<name>.yaml); the weights are generated where they run
(``python -m spec_decode build synthetic``, engines/embedded/synthetic.py), never committed.

Also here: the committed per-draft-length accept-length tables (conf/accept_len/<name>.yaml) that a
forced run may take its accept length from (``spec.simulate_accept_table``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

DTYPES = ("bfloat16", "float16", "float32")
RECORD = "synthetic.json"  # written beside the weights: the spec they were generated from
TABLES_DIR = Path(__file__).resolve().parents[2] / "conf" / "accept_len"


class SyntheticError(ValueError):
    """A synthetic spec or an accept-length table that cannot be used; the message names the key."""


@dataclass
class SyntheticConfig:
    """The HF config.json fields of a Llama-family model, plus the seed and dtype of its weights.
    For a drafter, ``draft_vocab_size`` (EAGLE-3's reduced vocabulary) and ``num_hidden_layers`` 1."""

    seed: int = 0
    dtype: str = "bfloat16"
    vocab_size: int = 256
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    # The context the engine allocates. Our static (CUDA-graph) path attends over every slot of it at
    # every step, so it is a cost: real-shape confs set it to what the benchmark needs, not the model's.
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    draft_vocab_size: Optional[int] = None  # drafters only (None: the target's vocabulary)
    source: str = ""  # what this shape copies, and where it differs (said in the record)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SyntheticError(f"synthetic.dtype={self.dtype!r}: use one of {', '.join(DTYPES)}")
        for key in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            if getattr(self, key) < 1:
                raise SyntheticError(f"synthetic.{key}={getattr(self, key)}: must be >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise SyntheticError(
                f"synthetic.hidden_size={self.hidden_size}: must be a multiple of "
                f"num_attention_heads={self.num_attention_heads} (head_dim)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise SyntheticError(
                f"synthetic.num_key_value_heads={self.num_key_value_heads}: must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )

    def spec(self) -> dict[str, Any]:
        """What decides the weights (``source`` is a note, not an input)."""
        return {k: v for k, v in asdict(self).items() if k != "source"}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.spec(), sort_keys=True).encode()).hexdigest()[:16]


def from_mapping(data: Any) -> SyntheticConfig:
    """A SyntheticConfig from a dict, a DictConfig or one already typed (Hydra hands either)."""
    if isinstance(data, SyntheticConfig):
        return data
    known = SyntheticConfig.__dataclass_fields__
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SyntheticError(f"synthetic: unknown key(s) {unknown}; known: {sorted(known)}")
    return SyntheticConfig(**{k: data[k] for k in data})


def generated_matches(model_dir: Path, syn: SyntheticConfig) -> str | None:
    """None if ``model_dir`` holds weights generated from ``syn``; otherwise why not."""
    record = model_dir / RECORD
    if not record.is_file():
        return f"{model_dir} has no {RECORD} (not generated yet)"
    try:
        have = json.loads(record.read_text()).get("spec")
    except json.JSONDecodeError:
        return f"{record} is not valid JSON"
    if have != syn.spec():
        return f"{record} was generated from another spec (seed, dtype or shape differ)"
    return None


# --------------------------------------------------------------------------- accept-length tables


@dataclass
class AcceptLenEntry:
    accept_len: float
    source: str  # where the number comes from; "placeholder, not published: ..." when it is not measured
    published: bool = False


@dataclass
class AcceptLenTable:
    name: str
    model: str
    drafter: str
    measured_on: str
    by_steps: dict[int, AcceptLenEntry] = field(default_factory=dict)

    def at(self, steps: int) -> AcceptLenEntry:
        if steps not in self.by_steps:
            raise SyntheticError(
                f"spec.simulate_accept_table={self.name}: no accept length for spec.steps={steps} "
                f"(conf/accept_len/{self.name}.yaml has steps {sorted(self.by_steps)}); "
                "add the entry with its source, or set spec.simulate_accept_len"
            )
        return self.by_steps[steps]


def load_table(name: str, tables_dir: Path = TABLES_DIR) -> AcceptLenTable:

    path = tables_dir / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in tables_dir.glob("*.yaml"))
        raise SyntheticError(
            f"spec.simulate_accept_table={name}: no {path.name} in conf/accept_len/ "
            f"(tables: {', '.join(have) or 'none'})"
        )
    raw = yaml.safe_load(path.read_text()) or {}
    try:
        entries = {int(k): AcceptLenEntry(**v) for k, v in (raw.get("by_steps") or {}).items()}
        table = AcceptLenTable(
            name=name, model=raw["model"], drafter=raw["drafter"], measured_on=raw["measured_on"], by_steps=entries
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SyntheticError(
            f"conf/accept_len/{name}.yaml: malformed ({e}); each by_steps entry needs accept_len, source and published"
        ) from None
    for steps, entry in entries.items():
        if not 1.0 <= entry.accept_len <= steps + 1:
            raise SyntheticError(
                f"conf/accept_len/{name}.yaml: by_steps.{steps}.accept_len={entry.accept_len} "
                f"must be in [1, {steps + 1}]"
            )
        if not entry.source.strip():
            raise SyntheticError(f"conf/accept_len/{name}.yaml: by_steps.{steps} has no source")
    return table
