"""The EAGLE-3 drafter checkpoint rules, in one place: the drafter architectures SGLang 0.5.23 loads
(and how many target layers each reads), which target layers a target family captures for the ids a
checkpoint names, and the checks a drafter/target pair must pass.

Used by preflight (before any server starts), by the doctor (through preflight) and by the embedded
engine (at its own start-up), so all refuse the same checkpoints with the same words. Plain Python:
the engine imports it on GPU boxes without Hydra or torch.

Facts (SGLang 0.5.23 wheel, file:line):
- Drafter architectures: ``LlamaForCausalLMEagle3`` (srt/models/llama_eagle3.py 272, EntryClass 387)
  and the MLA drafter ``Eagle3DeepseekV2ForCausalLM`` (srt/models/kimi_k25_eagle3.py 315, EntryClass
  523) of ``lightseekorg/kimi-k2.5-eagle3-mla``. The contract tier checks this set against every
  ``EntryClass`` of the installed package.
- The ids a target captures come from the drafter's ``eagle_config.eagle_aux_hidden_state_layer_ids``
  (srt/model_executor/model_runner_components/spec_aux_hidden_state.py 186-196), None when absent.
- The drafter's fc reads as many target layers as the checkpoint names; 3 only when it names none
  (llama_eagle3.py 157-161; kimi_k25_eagle3.py 48-59).
- "ids in the checkpoint -> layers captured" (the index of the layer whose *input* is captured):
  Llama targets: none named -> [2, n//2, n-3]; named -> every id + 1 (srt/models/llama.py 929-941).
  DeepSeek-V2/V3 targets (Kimi-K2.5's language model: srt/models/kimi_k25.py 928-939): the same
  default; named -> + 1 only when the first id is 1, else as named (srt/models/deepseek_v2.py
  3458-3473). A captured index must be a layer of the target (0..n-1).
"""

from __future__ import annotations

import json
from pathlib import Path

# Drafter architecture -> the SGLang 0.5.23 module whose EntryClass loads it (srt/models/<module>.py).
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLMEagle3": "llama_eagle3",
    "Eagle3DeepseekV2ForCausalLM": "kimi_k25_eagle3",
}
ARCHITECTURE = "LlamaForCausalLMEagle3"  # the Llama-form drafter: what the embedded engine builds and loads
DEFAULT_AUX_LAYERS = 3  # target layers a drafter reads when its checkpoint names none
AUX_LAYERS = DEFAULT_AUX_LAYERS  # (old name, kept for the embedded engine's imports)
LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"  # under "eagle_config" in the drafter's config.json

LLAMA, DEEPSEEK = "llama", "deepseek"
# Target architecture (its language model's, or the wrapper's) -> the family whose capture rule applies.
TARGET_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": LLAMA,
    "DeepseekV2ForCausalLM": DEEPSEEK,
    "DeepseekV3ForCausalLM": DEEPSEEK,
    "KimiK25ForConditionalGeneration": DEEPSEEK,  # delegates to its DeepseekV3ForCausalLM language model
}
FAMILY_SOURCES = {LLAMA: "srt/models/llama.py 929-941", DEEPSEEK: "srt/models/deepseek_v2.py 3458-3473"}


def language_model(tcfg: dict | None) -> dict:
    """The language model's part of a target's config.json: its ``text_config`` when nested there
    (Kimi-K2.5, multimodal wrappers), else the config itself. Every shape check reads this."""
    tcfg = tcfg or {}
    text = tcfg.get("text_config")
    return text if isinstance(text, dict) else tcfg


def num_layers(tcfg: dict | None) -> int | None:
    n = language_model(tcfg).get("num_hidden_layers")
    return n if isinstance(n, int) else None


def target_family(tcfg: dict | None) -> str | None:
    """The capture rule's family of a target config (llama | deepseek), None when not known."""
    for cfg in (language_model(tcfg), tcfg or {}):
        for arch in cfg.get("architectures") or []:
            if arch in TARGET_FAMILIES:
                return TARGET_FAMILIES[arch]
    return None


def default_captured(n_layers: int) -> list[int]:
    """The layers both families capture when the checkpoint names no ids."""
    return [2, n_layers // 2, n_layers - 3]


def captured_layers(ids: list[int] | None, n_layers: int | None, family: str | None) -> list[int] | None:
    """The target layers captured for the ids a checkpoint names (None: SGLang's default); None when
    that is not known (no layer count for the default, or a target family we have no rule for)."""
    if ids is None:
        return default_captured(n_layers) if n_layers else None
    if family == LLAMA:
        return [i + 1 for i in ids]
    if family == DEEPSEEK:
        return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)
    return None


def default_layer_ids(num_layers: int) -> list[int]:
    """Ids that a Llama target captures as SGLang's default (``[1, n//2 - 1, n - 4]`` -> captured
    ``[2, n//2, n - 3]``): what the embedded engine (a Llama target) reads when none are named."""
    return [c - 1 for c in default_captured(num_layers)]


def configured_layer_ids(dcfg: dict) -> list[int] | None:
    """The layer ids the checkpoint's config.json names, or None (then SGLang's default applies)."""
    ids = (dcfg.get("eagle_config") or {}).get(LAYER_IDS_KEY)
    return list(ids) if ids else None


def served_layer_ids(dcfg: dict, num_layers: int | None) -> list[int] | None:
    """The layer ids a Llama-target server reads for this drafter: the configured ones, else the ids
    equivalent to SGLang's default (None when neither is known)."""
    ids = configured_layer_ids(dcfg)
    if ids is None and num_layers:
        ids = default_layer_ids(num_layers)
    return ids


def aux_layer_count(dcfg: dict) -> int:
    """Target layers this drafter's fc reads: from the checkpoint, 3 only when it names none
    (llama_eagle3.py 157-161 also honours ``num_aux_hidden_states``; kimi_k25_eagle3.py 48-59 also a
    top-level ``eagle_aux_hidden_state_layer_ids``)."""
    arch = (dcfg.get("architectures") or [None])[0]
    if arch == "LlamaForCausalLMEagle3" and isinstance(dcfg.get("num_aux_hidden_states"), int):
        return dcfg["num_aux_hidden_states"]
    ids = configured_layer_ids(dcfg)
    if ids is None and arch == "Eagle3DeepseekV2ForCausalLM" and dcfg.get(LAYER_IDS_KEY):
        ids = list(dcfg[LAYER_IDS_KEY])
    return len(ids) if ids else DEFAULT_AUX_LAYERS


def read_config(path: Path) -> dict:
    """A checkpoint's config.json as a dict; ValueError naming the file when it is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); fix or re-pull it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a JSON object")
    return data


def describe(ids: list[int] | None, tcfg: dict | None) -> str:
    """``ids [0, 29, 57] -> captured layers [0, 29, 57] (deepseek rule)`` for messages."""
    fam = target_family(tcfg)
    cap = captured_layers(ids, num_layers(tcfg), fam)
    named = "no ids (SGLang's default)" if ids is None else f"ids {list(ids)}"
    if ids is not None and EMBEDDING_ID in ids:
        named += " (-1: the embedding output)"
    if cap is None:
        return named
    return f"{named} -> captured layers {cap} ({fam or 'default'} rule)"


def problems(dcfg: dict, tcfg: dict | None, where: str, trained_ids: list[int] | None = None) -> list[str]:
    """Every reason this drafter config cannot serve this target (empty when it can).

    ``where`` names the drafter's config.json in the messages; ``tcfg`` is the target's config.json
    (None when not on this machine: the shape checks are skipped; a nested ``text_config`` is read);
    ``trained_ids`` are the ids the drafter was trained on (its training.json), when known."""
    out: list[str] = []
    arch = dcfg.get("architectures")
    if not (isinstance(arch, list) and len(arch) == 1 and arch[0] in ARCHITECTURES):
        out.append(
            f"{where}: architectures is {arch!r}; SGLang 0.5.23 loads an EAGLE-3 drafter only as one "
            f"of {sorted(ARCHITECTURES)} (it does not rewrite the name)"
        )
    n = num_layers(tcfg)
    ids = configured_layer_ids(dcfg)
    count = aux_layer_count(dcfg)
    if ids is not None and len(ids) != count:
        out.append(
            f"{where}: {len(ids)} layer ids {ids} ({LAYER_IDS_KEY}) but the drafter reads {count} "
            "target layers (num_aux_hidden_states); make them agree"
        )
    family = target_family(tcfg)
    cap = captured_layers(ids, n, family)
    if n and cap is not None and not all(isinstance(c, int) and 0 <= c <= n - 1 for c in cap):
        rule = f"ids in 0..{n - 2} under the +1 rule" if family == LLAMA else "ids that capture layers of it"
        out.append(
            f"{where}: {describe(ids, tcfg)}, but the {n}-layer target has layers 0..{n - 1}; "
            f"use {rule} ({FAMILY_SOURCES.get(family or '', '')})"
        )
    if ids is None and n and count != DEFAULT_AUX_LAYERS:
        out.append(
            f"{where}: names no layer ids, so the target captures {DEFAULT_AUX_LAYERS} layers "
            f"{default_captured(n)}, but the drafter reads {count}"
        )
    if (m := trained_mismatch(trained_ids, ids, where, tcfg)) is not None:
        out.append(m)
    lm = language_model(tcfg)
    if "hidden_size" in lm:  # the target's full config.json is here: check the shapes
        hidden = lm.get("hidden_size")
        if hidden not in (dcfg.get("hidden_size"), dcfg.get("target_hidden_size")):
            out.append(
                f"{where}: drafter hidden size {dcfg.get('hidden_size')} does not fit the target's "
                f"{hidden}{' (text_config.hidden_size)' if lm is not tcfg else ''}"
            )
        missing = [
            w for w, c in (("the drafter's", dcfg), ("the target's", lm)) if not isinstance(c.get("vocab_size"), int)
        ]
        if missing:
            out.append(
                f"{where}: {' and '.join(missing)} config.json has no vocab_size (an integer): the vocabularies "
                "cannot be checked; add it"
            )
        elif dcfg.get("vocab_size") != lm.get("vocab_size"):
            out.append(
                f"{where}: drafter vocab_size {dcfg.get('vocab_size')} != target vocab_size {lm.get('vocab_size')}"
            )
        dv = dcfg.get("draft_vocab_size", dcfg.get("vocab_size"))
        if not missing and not (isinstance(dv, int) and dv <= lm["vocab_size"]):
            out.append(f"{where}: drafter draft_vocab_size {dv} exceeds the target vocab ({lm.get('vocab_size')})")
    return out


def same_layers(a: list[int] | None, b: list[int] | None, tcfg: dict | None) -> bool:
    """Whether two sets of checkpoint ids capture the same target layers (compared as captured layers
    when the target's rule is known, else as ids)."""
    n, fam = num_layers(tcfg), target_family(tcfg)
    if n:  # no ids named = the ids that capture the default under either rule
        a, b = (default_layer_ids(n) if x is None else x for x in (a, b))
    ca, cb = captured_layers(a, n, fam), captured_layers(b, n, fam)
    if fam is not None and ca is not None and cb is not None:
        return ca == cb
    return a == b if (a is None or b is None) else list(a) == list(b)


def trained_mismatch(
    trained_ids: list[int] | None, served: list[int] | None, where: str, tcfg: dict | None = None
) -> str | None:
    """The message for a drafter served on other target layers than it was trained on (the seed's bug:
    output stays lossless, acceptance collapses), or None. ``served``: the checkpoint's ids (None =
    SGLang's default); compared as captured layers under the target's rule."""
    if trained_ids is None or same_layers(trained_ids, served, tcfg):
        return None
    return (
        f"{where}: trained on {describe(list(trained_ids), tcfg)} (training.json) but served with "
        f"{describe(served, tcfg)} (eagle_config.{LAYER_IDS_KEY}): acceptance would collapse; "
        "serve it with the ids it was trained on or retrain it"
    )


EMBEDDING_ID = -1  # under the Llama rule id + 1 = 0: the input of layer 0, i.e. the embedding output


def layer_ids_error(ids: list[int]) -> str | None:
    """What is wrong with configured layer ids on their own (compose time), or None. -1 is a capture (the
    embedding output): whether it is the right one, preflight says (``embedding_capture``)."""
    if len(ids) != DEFAULT_AUX_LAYERS or len(set(ids)) != DEFAULT_AUX_LAYERS:
        return f"EAGLE-3 reads {DEFAULT_AUX_LAYERS} distinct target layers"
    if min(ids) < EMBEDDING_ID:
        return (
            "ids are >= -1 (-1 captures the embedding output, 0.. the decoder layers' outputs); use the ids "
            "the drafter was trained on (its training.json)"
        )
    return None


def embedding_capture(
    ids: list[int], trained: list[int] | None, served: list[int] | None, drafter_name: str, tcfg: dict | None
) -> str | None:
    """The message for ``drafter.layer_ids`` that name -1 where the drafter was not trained on it (the
    issue-44 mistake: -1 is no "last layer", it captures the embedding output), or None. Names the
    trained ids (training.json), else the checkpoint's (config.json), and the ids to use."""
    if EMBEDDING_ID not in ids:
        return None
    right, source = (trained, "training.json") if trained is not None else (served, f"eagle_config.{LAYER_IDS_KEY}")
    if right is not None and same_layers(right, ids, tcfg):
        return None  # trained on the embedding output: nothing wrong
    what = (
        f"drafter={drafter_name} was trained on {describe(list(right), tcfg)} ({source}): use "
        f"drafter.layer_ids=[{','.join(map(str, right))}]"
        if right is not None
        else "the drafter's trained ids are unknown (no training.json, no ids in its config.json)"
    )
    return (
        f"drafter.layer_ids={list(ids)}: -1 captures the embedding output (the input of layer 0: the target "
        f"captures id + 1, {FAMILY_SOURCES[LLAMA]}), not a decoder layer's output; {what}"
    )


def trained_layer_ids(checkpoint: Path) -> list[int] | None:
    """The layer ids the drafter was trained on, from its training.json (None when absent)."""
    record = Path(checkpoint) / "training.json"
    if not record.is_file():
        return None
    ids = read_config(record).get("trained_aux_layer_ids")
    return list(ids) if ids is not None else None
