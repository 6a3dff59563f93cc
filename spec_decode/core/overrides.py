"""Command-line overrides checked against the typed schema before Hydra composes anything.

Hydra's own answer to a typo (``spec.step=3``) is "To append to your config use +spec.step=3", and
``+spec.step=3`` then composes: the added key is silently ignored and a full job runs at steps=2.
Here both are refused with the key named and a did-you-mean (difflib) for the close key. Only the
``dict`` fields of the schema (``nccl.env``, ``engine.env``) take added keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing

from hydra._internal.utils import (
    get_args_parser,  # Hydra's own argv parser: the same flags run.py takes
)
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from spec_decode.core.config import ENGINES, ConfigError, ExperimentConfig

OPEN = "open"  # a dict field: any key below it is allowed


def schema_keys(schema: type = ExperimentConfig, prefix: str = "") -> dict[str, object]:
    """Every dotted key of the schema -> its dataclass (a group), OPEN (a dict) or None (a value).
    engine.* is the union of every engine's schema: the selected engine's own check is compose time."""
    out: dict[str, object] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key, tp = prefix + f.name, hints[f.name]
        if typing.get_origin(tp) is typing.Union:
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if key == "engine":
            out[key] = tp
            for eng in ENGINES.values():
                out.update(schema_keys(eng, key + "."))
        elif dataclasses.is_dataclass(tp):
            out[key] = tp
            out.update(schema_keys(tp, key + "."))
        elif tp is dict or typing.get_origin(tp) is dict:
            out[key] = OPEN
        else:
            out[key] = None
    return out


def _unknown(key: str, value: str, how: str, known: dict[str, object]) -> str:
    head, _, last = key.rpartition(".")
    where = f"{head} has no key {last!r}" if head else f"the config has no key {last!r}"
    close = difflib.get_close_matches(key, [k for k in known if known[k] is not OPEN], n=1, cutoff=0.6)
    hint = (
        f"; did you mean {close[0]}={value}?"
        if close
        else f"; keys of {head or 'the config'}: "
        + ", ".join(sorted(k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == head))
    )
    return f"{how}: {where}{hint}"


def check_argv(argv: list[str]) -> None:
    """Refuse overrides that name no key of the schema, before Hydra composes or any server starts."""
    known = schema_keys()
    args = get_args_parser().parse_args(argv)
    errors = []
    for ov in OverridesParser.create().parse_overrides(args.overrides):
        key = ov.key_or_group
        if key.startswith("hydra") or "/" in key or ov.package is not None or ov.is_delete():
            continue
        if key == "experiment":  # a group with no schema node: its files are deltas on the whole config
            continue
        parts = key.split(".")
        if any(known.get(".".join(parts[:i])) is OPEN for i in range(1, len(parts))):
            continue  # below a dict field (nccl.env.NCCL_ALGO): any key
        if key not in known:
            line = ov.input_line or key
            errors.append(_unknown(key, line.partition("=")[2], line, known))
    if errors:
        raise ConfigError(
            "\n".join(errors) + "\n(typed groups take no added keys: '+' adds only below "
            "nccl.env / engine.env; python run.py --cfg job shows every key)"
        )


def check_composed(cfg: DictConfig) -> None:
    """The composed config has no key its typed node does not declare (a '+key' from a caller that
    composes without run.py, e.g. hydra.compose in a test or notebook)."""
    errors = []

    def walk(node: DictConfig, prefix: str) -> None:
        tp = OmegaConf.get_type(node)
        names = {f.name for f in dataclasses.fields(tp)} if dataclasses.is_dataclass(tp) else None
        for k in node.keys():
            key = f"{prefix}{k}"
            if names is not None and k not in names:
                errors.append(_unknown(key, str(OmegaConf.select(node, str(k))), f"+{key}", schema_keys()))
            child = node._get_node(k)
            if isinstance(child, DictConfig) and names is not None:
                walk(child, key + ".")

    walk(cfg, "")
    if errors:
        raise ConfigError("\n".join(errors) + "\n(typed groups take no added keys)")
