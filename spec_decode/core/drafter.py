"""The EAGLE-3 drafter checkpoint rules, in one place: the architecture name SGLang loads, the target
layers SGLang captures when the checkpoint names none, and the checks a checkpoint must pass.

Used by preflight (before any server starts) and by the embedded engine (at its own start-up), so both
refuse the same checkpoints with the same words. Plain Python: the engine imports it on GPU boxes
without Hydra or torch.
"""

from __future__ import annotations

import json
from pathlib import Path

ARCHITECTURE = "LlamaForCausalLMEagle3"  # SGLang 0.5.23 loads an EAGLE-3 drafter only under this name
AUX_LAYERS = 3  # EAGLE-3 reads the hidden states of 3 target layers
LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"  # under "eagle_config" in the drafter's config.json


def default_layer_ids(num_layers: int) -> list[int]:
    """The target layers SGLang captures when the drafter's config names none (0.5.23:
    ``[1, num_layers // 2 - 1, num_layers - 4]``)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def configured_layer_ids(dcfg: dict) -> list[int] | None:
    """The layer ids the checkpoint's config.json names, or None (then SGLang's default applies)."""
    ids = (dcfg.get("eagle_config") or {}).get(LAYER_IDS_KEY)
    return list(ids) if ids else None


def served_layer_ids(dcfg: dict, num_layers: int | None) -> list[int] | None:
    """The layer ids a server reads for this drafter: the configured ones, else SGLang's default
    (None when neither is known: no config entry and no target layer count)."""
    ids = configured_layer_ids(dcfg)
    if ids is None and num_layers:
        ids = default_layer_ids(num_layers)
    return ids


def read_config(path: Path) -> dict:
    """A checkpoint's config.json as a dict; ValueError naming the file when it is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); fix or re-pull it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a JSON object")
    return data


def problems(dcfg: dict, tcfg: dict | None, where: str, trained_ids: list[int] | None = None) -> list[str]:
    """Every reason this drafter config cannot serve this target (empty when it can).

    ``where`` names the drafter's config.json in the messages; ``tcfg`` is the target's config.json
    (None when not on this machine: the shape checks are skipped); ``trained_ids`` are the layer ids
    the drafter was trained on (its training.json), when known."""
    out: list[str] = []
    arch = dcfg.get("architectures")
    if arch != [ARCHITECTURE]:
        out.append(f"{where}: architectures is {arch!r}; SGLang loads an EAGLE-3 drafter only as "
                   f"[\"{ARCHITECTURE}\"] (it does not rewrite the name)")
    n_layers = (tcfg or {}).get("num_hidden_layers")
    served = served_layer_ids(dcfg, n_layers)
    if served is not None and n_layers:
        if len(served) != AUX_LAYERS or not all(isinstance(i, int) and 0 <= i <= n_layers - 2 for i in served):
            out.append(f"{where}: layer ids {served} ({LAYER_IDS_KEY}) must be {AUX_LAYERS} ids in "
                       f"0..{n_layers - 2} for the {n_layers}-layer target")
    if (m := trained_mismatch(trained_ids, served, where)) is not None:
        out.append(m)
    if tcfg and "hidden_size" in tcfg:  # the target's full config.json is here: check the shapes
        hidden = tcfg.get("hidden_size")
        if hidden not in (dcfg.get("hidden_size"), dcfg.get("target_hidden_size")):
            out.append(f"{where}: drafter hidden size {dcfg.get('hidden_size')} does not fit the target's "
                       f"{hidden}")
        if dcfg.get("vocab_size") != tcfg.get("vocab_size"):
            out.append(f"{where}: drafter vocab_size {dcfg.get('vocab_size')} != target vocab_size "
                       f"{tcfg.get('vocab_size')}")
        dv = dcfg.get("draft_vocab_size", dcfg.get("vocab_size"))
        if not (isinstance(dv, int) and dv <= (tcfg.get("vocab_size") or 0)):
            out.append(f"{where}: drafter draft_vocab_size {dv} exceeds the target vocab "
                       f"({tcfg.get('vocab_size')})")
    return out


def trained_mismatch(trained_ids: list[int] | None, served: list[int] | None, where: str) -> str | None:
    """The message for a drafter served on other target layers than it was trained on (the seed's bug:
    output stays lossless, acceptance collapses), or None."""
    if trained_ids is None or served is None or list(trained_ids) == list(served):
        return None
    return (f"{where}: trained on target layers {list(trained_ids)} (training.json) but served with "
            f"layer ids {list(served)} (eagle_config.{LAYER_IDS_KEY}): acceptance would collapse; "
            "serve it with the ids it was trained on or retrain it")


def trained_layer_ids(checkpoint: Path) -> list[int] | None:
    """The layer ids the drafter was trained on, from its training.json (None when absent)."""
    record = Path(checkpoint) / "training.json"
    if not record.is_file():
        return None
    ids = read_config(record).get("trained_aux_layer_ids")
    return list(ids) if ids is not None else None
