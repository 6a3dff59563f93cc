"""The packages are the layers: a lower layer never imports a higher one (docs/architecture.md).

Floors, bottom up: core < analysis < record < runner < views. Beside them: parsers and probe (leaves),
engines (core and its own modules; the embedded engine's processes also run the plugins), profiler (code
that runs inside the server: parsers and the plugin registry only). Every import counts, at module
level, inside a function or under TYPE_CHECKING alike.

KNOWN lists the arrows that still run the wrong way, each with the piece that sits in the wrong room.
It may only shrink: a new wrong arrow fails, and so does a listed one that no longer exists (delete it).
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "spec_decode"
FLOOR = {"core": 0, "analysis": 1, "record": 2, "runner": 3, "views": 4}
# side packages: what each may import (besides itself)
SIDE = {
    "parsers": set(),
    "probe": {"engines.sglang"},  # the ablation launches ranks with the env SGLang's launcher sets
    "engines": {"core", "analysis"},  # the model builds report stats (analysis.stats)
    "profiler": {"parsers", "engines.plugins"},
}
SIDE_USERS = {  # which floors may import each side package
    "parsers": 1,
    "probe": 2,
    "engines": 3,
    "profiler": 3,
}
KNOWN = {
    # the analysis reads record types and the performance-only rule, which the record owns
    ("analysis.costmodel", "record.results"),
    ("analysis.batchcost", "record.results"),  # costmodel's batch half (split at 400 lines): the same arrow
    ("analysis.recommend", "record.results"),
    # the embedded engine's launcher starts a ServerProcess that sits in runner/
    ("engines", "runner.server"),
    ("engines.embedded.ranks", "runner.server"),  # free_port
    # the Hydra wiring opens the MLflow view: cli belongs above the floors, beside run.py
    ("runner.cli", "views.tracking"),
}


def _package(mod: str) -> str:
    return mod.split(".")[0]


def _allowed(src: str, dst: str) -> bool:
    a, b = _package(src), _package(dst)
    if a == b or dst in ("", "__main__"):
        return True
    if a in SIDE:
        return b in SIDE[a] or dst in SIDE[a]
    if b in SIDE:
        return FLOOR.get(a, 99) >= SIDE_USERS[b]
    return FLOOR.get(a, 99) >= FLOOR[b]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, mod: str):
    tree = ast.parse(path.read_text())
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and _is_type_checking(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }  # annotations only: no runtime arrow
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["spec_decode", *pkg][: len(pkg) + 2 - node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            targets = [f"{name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            if t.startswith("spec_decode."):
                yield t.removeprefix("spec_decode.")


def arrows() -> set[tuple[str, str]]:
    """(importer, imported) for every wrong-way import in the package."""
    found = set()
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if not parts or parts[0] in ("__main__",):  # the package root and the CLI sit above every floor
            continue
        mod = ".".join(parts)
        for dst in _imports(path, mod):
            dst_mod = _module_of(dst)
            if not _allowed(mod, dst_mod):
                found.add((mod, dst_mod))
    return found


def _module_of(dotted: str) -> str:
    """The longest prefix of ``a.b.c`` that is a module or package of ours (``a.b.func`` -> ``a.b``)."""
    parts = dotted.split(".")
    while parts:
        p = PKG.joinpath(*parts)
        if p.with_suffix(".py").exists() or p.is_dir():
            return ".".join(parts)
        parts.pop()
    return ""  # the package root (__version__)


def test_no_new_upward_import():
    new = arrows() - KNOWN
    assert not new, "a lower layer imports a higher one (move the shared piece down a floor): " + ", ".join(
        f"{a} -> {b}" for a, b in sorted(new)
    )


def test_known_list_only_shrinks():
    gone = KNOWN - arrows()
    assert not gone, f"fixed, so delete from KNOWN: {sorted(gone)}"
