"""docs/architecture.md is the map of the code: its layers block names every module of every package (its
subpackages' too: ``engines/embedded/*.py`` in the ``engines`` entry), in that package's entry, and every floor
it states is the one ``tests/unit/test_layers.py`` enforces. A module added, moved or removed without the map
fails here."""

import re

import pytest

from .test_layers import FLOOR, PKG, TOP

pytestmark = pytest.mark.unit

DOC = PKG.parent / "docs" / "architecture.md"


def layer_entries() -> dict[str, str]:
    """Package (or top-level module) -> the text of its entry in the layers block."""
    block = DOC.read_text().split("## The layers", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    name = None
    for line in block.splitlines():
        m = re.match(r"^  (\w+)(/|\.py)?\s", line)
        if m:
            name = m.group(1)
            entries[name] = ""
        if name:
            entries[name] += line + "\n"
    return entries


def listed(stem: str) -> str:
    """A module as the map lists it: its name followed by its description or the next name (`` (``, also
    on the next line, `` =``, ``,``, ``)``, ``;``, ``:``, `` and``), not the same word in prose ("Triton
    kernels that ...", "a row's request slot")."""
    return rf"(?<![\w.`]){re.escape(stem)}(?=\s*\(| =|,|\)|;|:| and\b)"


def unnamed_modules() -> list[str]:
    entries = layer_entries()
    missing = []
    for pkg in sorted(p for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        text = entries.get(pkg.name)
        if text is None:
            missing.append(f"{pkg.name}/ (no entry)")
            continue
        for mod in sorted(pkg.rglob("*.py")):  # a subpackage's modules too, in the package's entry
            if mod.stem != "__init__" and not re.search(listed(mod.stem), text, re.M):
                missing.append(str(mod.relative_to(PKG)))
    for top in sorted(TOP):
        if top not in entries:
            missing.append(f"{top}.py (no entry)")
    return missing


def test_the_layers_block_names_every_module():
    missing = unnamed_modules()
    assert not missing, "docs/architecture.md's layers block does not name: " + ", ".join(missing)


def test_the_floors_the_map_states_are_the_enforced_ones():
    entries = layer_entries()
    for pkg, floor in FLOOR.items():
        assert f"floor {floor}" in entries[pkg], f"docs/architecture.md: {pkg}/ is floor {floor} in test_layers.FLOOR"
