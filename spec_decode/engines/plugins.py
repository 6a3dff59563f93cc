"""Plugin loading shared by both engines: the ``sglang.srt.plugins`` entry-point group and a hook
registry with SGLang's semantics.

SGLang 0.5.23 calls ``load_plugins()`` in every process it starts (launcher, each TP rank, the
detokenizer) and later applies the registered hooks with ``HookRegistry.apply_hooks()``. The embedded
engine does the same in each of its processes through :func:`load_plugins` here, so the profiler
plugin that runs under SGLang runs, unchanged, in our engine's ranks -- live in CI.

When sglang is installed its own ``HookRegistry`` is used (one registry per process, whoever loads the
plugins); otherwise a small compatible one of ours (same ``register(target, hook, HookType.X)``
signature and AROUND/BEFORE/AFTER/REPLACE semantics, applied by patching the dotted target).
"""

from __future__ import annotations

import functools
import logging
import os
import pkgutil
import sys
from collections import defaultdict
from enum import Enum
from importlib.metadata import entry_points

log = logging.getLogger("spec_decode.engines.plugins")
GROUP = "sglang.srt.plugins"
SGLANG_REGISTRY = "sglang.srt.plugins.hook_registry"


class _HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class _HookRegistry:
    """SGLang's HookRegistry contract, for processes without sglang (our embedded engine)."""

    _hooks: dict = defaultdict(list)
    _patched: set = set()

    @classmethod
    def register(cls, target: str, hook, hook_type=_HookType.AFTER, **_ignored) -> None:
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls) -> None:
        for target, hooks in sorted(cls._hooks.items()):
            if target in cls._patched:
                continue
            try:
                cls._apply(target, hooks)
                cls._patched.add(target)
            except Exception:  # noqa: BLE001 - as SGLang: a bad target is logged, never fatal
                log.exception("Failed to apply hooks to %s", target)

    @classmethod
    def _apply(cls, target: str, hooks: list) -> None:
        owner_path, attr = target.rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
        wrapper_type = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        original = raw.__func__ if wrapper_type else getattr(owner, attr)
        wrapped = original
        for hook_type, hook in sorted(hooks, key=lambda h: h[0] is not _HookType.REPLACE):
            wrapped = _wrap(wrapped, hook, hook_type)
        setattr(owner, attr, wrapper_type(wrapped) if wrapper_type else wrapped)
        log.info("Applied %d hook(s) to %s", len(hooks), target)

    @classmethod
    def reset(cls) -> None:
        cls._hooks.clear()
        cls._patched.clear()


def _wrap(original, hook, hook_type):
    if hook_type is _HookType.REPLACE:
        if isinstance(hook, type):
            return hook
        call = lambda *a, **k: hook(*a, **k)  # noqa: E731
    elif hook_type is _HookType.BEFORE:

        def call(*a, **k):
            changed = hook(*a, **k)
            if changed is not None:
                a, k = changed
            return original(*a, **k)
    elif hook_type is _HookType.AFTER:

        def call(*a, **k):
            result = original(*a, **k)
            new = hook(result, *a, **k)
            return result if new is None else new
    else:

        def call(*a, **k):
            return hook(original, *a, **k)

    wrapper = functools.wraps(original)(call)
    wrapper.__wrapped__ = original
    return wrapper


# Modules only the embedded engine's own processes import (its HTTP front, its rank scheduler) before
# loading plugins (the profiler plugin tells its engine by them too).
EMBEDDED_PROCESS_MODULES = ("spec_decode.engines.embedded.server", "spec_decode.engines.embedded.scheduler")


def _sglang_registry():
    if any(m in sys.modules for m in EMBEDDED_PROCESS_MODULES):
        # our engine's process: we load its plugins, so ours is the one registry (trying sglang's cost
        # ~1.5 s of CPU per process where sglang is installed without its runtime: it imports torch first)
        return None
    try:
        from sglang.srt.plugins.hook_registry import (  # lazy: only inside SGLang (optional)
            HookRegistry,
            HookType,
        )
    except Exception:  # noqa: BLE001 - absent, or present without its runtime deps
        return None
    return HookRegistry, HookType


@functools.cache
def registry() -> tuple[type, type, str]:
    """(HookRegistry, HookType, source): SGLang's when it imports, else ours. Resolved on first use
    (importing sglang costs seconds), once per process, so the plugin and the engine share one."""
    found = _sglang_registry()
    return (*found, "sglang") if found else (_HookRegistry, _HookType, "spec_decode")


def __getattr__(name: str):
    if name in ("HookRegistry", "HookType", "REGISTRY_SOURCE"):
        return registry()[("HookRegistry", "HookType", "REGISTRY_SOURCE").index(name)]
    raise AttributeError(name)


def load_plugins(apply: bool = True) -> list[str]:
    """Load every ``sglang.srt.plugins`` entry point (only the names in ``SGLANG_PLUGINS`` when that
    is set, as SGLang does), call it, then apply the registered hooks (``apply``; the embedded front,
    which runs no decoding, registers them only: applying would import their targets, and torch with
    them, for hooks that could never fire there). Returns the names loaded."""
    allowed = {n.strip() for n in os.environ.get("SGLANG_PLUGINS", "").split(",") if n.strip()}
    loaded = []
    for ep in entry_points(group=GROUP):
        if allowed and ep.name not in allowed:
            continue
        try:
            ep.load()()
        except Exception:  # noqa: BLE001 - a broken plugin must not take the server down
            log.exception("plugin %s failed to load", ep.name)
            continue
        loaded.append(ep.name)
    # Hooks are registered through a registry someone asked for (registry(), or SGLang's module taken
    # directly): with none asked for there is nothing to apply, and resolving it here would try to
    # import sglang -- and with it torch, ~1 s -- in a process that needs neither (the embedded front).
    if apply and (registry.cache_info().currsize or SGLANG_REGISTRY in sys.modules):
        registry()[0].apply_hooks()
    return loaded
