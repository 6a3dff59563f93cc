"""A config's identity: the resolved config as plain data, its hash, its flat keys."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from omegaconf import OmegaConf

# A job-name item (an override) that selects the drafter or the speculation: a job's baseline is the job
# without them (runner.job.baseline_name), and a cell's name always keeps them (analysis.compare.entries).
SPEC_ITEM = re.compile(r"^[+~]*(spec|drafter)([.=]|$)")
# Hydra's override_dirname joins "key=value" items with ","; values may hold commas ([1,3,4]).
_ITEM = re.compile(r",(?=[+~]*[\w./@-]+=)")


def override_items(name: str) -> list[str]:
    """A job name's ``key=value`` items (``nccl=tuned,drafter.layer_ids=[1,3,4]`` -> two items)."""
    return [item for item in _ITEM.split(name) if item]


def resolved_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config (an ExperimentConfig) as plain data: what results.json stores and the config
    hash covers."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def config_hash(data: dict[str, Any]) -> str:
    """Equal for equal resolved configs (key order does not matter)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
