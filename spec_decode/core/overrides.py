"""Command-line overrides checked against the typed schema before Hydra composes anything.

Hydra's own answer to a typo (``spec.step=3``) is "To append to your config use +spec.step=3", and
``+spec.step=3`` then composes: the added key is silently ignored and a full job runs at steps=2.
Here both are refused with the key named and a did-you-mean (difflib) for the close key. Only the
``dict`` fields of the schema (``nccl.env``, ``engine.env``) take added keys.

Values are checked too, each value of a sweep included: a value of the wrong type (``spec.steps=abc``)
and a config group option with no file (``hardware=h100x8``) are refused with the key and what it
takes (the type, or the group's options), exit 2 -- Hydra's own answer is a traceback and exit 1,
and in a sweep it ends every job. Range rules (``spec.steps=0``) stay with the schema's
``__post_init__``: in a sweep such a job is one FAILED record (``hydra_entry``).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import typing
from pathlib import Path

from hydra._internal.utils import (
    get_args_parser,  # Hydra's own argv parser: the same flags run.py takes
)
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf

from spec_decode.core.config import ENGINES, ConfigError, ExperimentConfig

OPEN = "open"  # a dict field: any key below it is allowed
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # run.py's config_path


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


def value_types(schema: type = ExperimentConfig, prefix: str = "") -> dict[str, tuple[type, bool]]:
    """Every dotted value key of the schema -> (its type, whether null is allowed); only the types a
    command-line value can be checked against (int, float, bool, str, Enum)."""
    out: dict[str, tuple[type, bool]] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key, tp, optional = prefix + f.name, hints[f.name], False
        if typing.get_origin(tp) is typing.Union:
            optional = type(None) in typing.get_args(tp)
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if key == "engine":  # the union of every engine's schema (a key two engines share: null if either allows)
            for eng in ENGINES.values():
                for k, (t, opt) in value_types(eng, key + ".").items():
                    out[k] = (out[k][0], out[k][1] or opt) if k in out else (t, opt)
        elif dataclasses.is_dataclass(tp):
            out.update(value_types(tp, key + "."))
        elif tp in (int, float, bool, str) or (isinstance(tp, type) and issubclass(tp, enum.Enum)):
            out[key] = (tp, optional)
        elif typing.get_origin(tp) is list and typing.get_args(tp)[:1] in ((int,), (float,), (bool,), (str,)):
            out[key] = (tp, optional)  # a list of values: each element checked
    return out


def group_options(group: str, conf_dirs: list[Path] | None = None) -> list[str] | None:
    """The options of a config group (its files in conf/<group>/ and in each extra config dir), None when
    it is no group there."""
    dirs = [d / group for d in (conf_dirs or [CONF_DIR]) if (d / group).is_dir()]
    if not dirs:
        return None
    return sorted({p.stem for d in dirs for p in d.glob("*.yaml")})


def _bad_value(key: str, value: object, tp: type, optional: bool) -> str | None:
    """Why ``value`` cannot be ``key``'s (None when it can, or cannot be told before composing)."""
    if value is None:
        return None if optional else f"{key} takes no null"
    if isinstance(value, str) and "${" in value:
        return None  # an interpolation: resolved at compose time
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp)
        kind = {bool: "true or false", int: "integers", float: "numbers", str: "values"}[inner]
        if not isinstance(value, list):
            example = f", e.g. {key}=[1,3,4]" if inner is int else ", e.g. [a,b]"
            return f"{key}={value}: {key} takes a list of {kind}{example}" + (" (or null)" if optional else "")
        bad = next((m for v in value if (m := _bad_value(key, v, inner, False)) is not None), None)
        return None if bad is None else f"{key}={value}: {key} takes a list of {kind}"
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        ok = str(value) in tp.__members__
        if not ok:
            return f"{key}={value}: not one of {', '.join(tp.__members__)}"
    else:
        return None  # str takes anything Hydra parses
    if ok:
        return None
    kind = {bool: "true or false", int: "an integer", float: "a number"}[tp]
    return f"{key}={value}: {key} takes {kind}" + (" (or null)" if optional else "")


def _values(ov) -> list:
    """The values an override sets: one, or each of a sweep's (choice or range); [] when not listable."""
    if not ov.is_sweep_override():
        return [ov.value()]
    try:
        return list(ov.sweep_iterator())
    except Exception:  # noqa: BLE001 - glob/interval sweeps: Hydra expands them against the config
        return []


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


def _parses(override: str) -> bool:
    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException:
        return False
    return True


def check_argv(argv: list[str]) -> None:
    """Refuse overrides that name no key of the schema, before Hydra composes or any server starts."""
    known, types = schema_keys(), value_types()
    args = get_args_parser().parse_args(argv)
    errors, bad_values = [], []
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except OverrideParseException as e:  # Hydra's answer is a traceback: the override and what to do instead
        bad = next((a for a in args.overrides if not _parses(a)), "")
        raise ConfigError(
            f"{bad} ({str(e).splitlines()[0]}): Hydra's override grammar cannot parse it; quote a value that holds '=', "
            "spaces or brackets, e.g. 'engine.extra_args=[\"--flag=value\"]' (the grammar: "
            "https://hydra.cc/docs/advanced/override_grammar/basic)"
        ) from None
    # Options come from conf/ (+ --config-dir); another primary config or search path: Hydra judges them.
    conf_dirs = [CONF_DIR, *([Path(args.config_dir)] if args.config_dir else [])]
    own_groups = not args.config_path and not any(o.key_or_group.startswith("hydra.searchpath") for o in overrides)
    for ov in overrides:
        key = ov.key_or_group
        if key.startswith("hydra") or "/" in key or ov.package is not None or ov.is_delete():
            continue
        if own_groups and "." not in key and (options := group_options(key, conf_dirs)) is not None:
            bad = [v for v in _values(ov) if isinstance(v, str) and "${" not in v and v not in options]
            bad_values += [f"{key}={v}: no such option of {key}; options: {', '.join(options)}" for v in bad]
            if key == "experiment":  # a group with no schema node: its files are deltas on the whole config
                continue
        parts = key.split(".")
        if any(known.get(".".join(parts[:i])) is OPEN for i in range(1, len(parts))):
            continue  # below a dict field (nccl.env.NCCL_ALGO): any key
        if key not in known:
            line = ov.input_line or key
            errors.append(_unknown(key, line.partition("=")[2], line, known))
        elif key in types:
            bad_values += [m for v in _values(ov) if (m := _bad_value(key, v, *types[key])) is not None]
    if errors:
        raise ConfigError(
            "\n".join(errors) + "\n(typed groups take no added keys: '+' adds only below "
            "nccl.env / engine.env; python run.py --cfg job shows every key)"
        )
    if bad_values:
        raise ConfigError(
            "\n".join(bad_values) + "\n(nothing was run; python run.py --help lists every group's options)"
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
