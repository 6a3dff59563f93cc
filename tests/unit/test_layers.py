"""The packages are the layers: a lower layer never imports a higher one (docs/architecture.md).

Floors, bottom up: core < record < analysis < runner < views. Above them all, imported by nothing of ours:
the command modules (``__main__``, ``hydra_entry``: Hydra -> run_job, ``bench``: an experiment's sweep ->
metrics.json). Beside them: parsers (a leaf), probe (``engines.sglang`` only),
engines (core, analysis (stats for the model builds, control's CPU_NO_NCCL) and its own modules;
the embedded engine's processes also run the plugins), profiler (code
that runs inside the server: parsers and the plugin registry only). Every import counts, at module
level, inside a function or under TYPE_CHECKING alike.

KNOWN lists the arrows that still run the wrong way, each with the piece that sits in the wrong room.
It may only shrink: a new wrong arrow fails, and so does a listed one that no longer exists (delete it).

Nothing in ``views/`` runs a sweep: no view starts ``run.py`` (a child process) or calls ``runner.job``; the
sweep commands live in ``spec_decode/bench.py``.

The engine is an object (``spec_decode/engines/engine.py``): outside ``engines/`` no comparison or
``match`` names an engine (``engine.name == "sglang"``); the code asks the engine instead.

No circles: the graph of every import (module level, inside functions, under TYPE_CHECKING) has no
circle between modules, and none between packages (a KNOWN arrow, while one is listed, is left out of
the package check: it is the arrow that would close a circle).
"""

import ast
from pathlib import Path

import pytest

from spec_decode.core.engine_config import ENGINES
from spec_decode.engines.engine import BY_NAME

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "spec_decode"
FLOOR = {"core": 0, "record": 1, "analysis": 2, "runner": 3, "views": 4}
# side packages: what each may import (besides itself)
SIDE = {
    "parsers": set(),
    "probe": {"engines.sglang"},  # the ablation launches ranks with the env SGLang's launcher sets
    "engines": {"core", "analysis"},  # analysis.stats (the model builds), analysis.control (CPU_NO_NCCL)
    "profiler": {"parsers", "engines.plugins"},
}
SIDE_USERS = {  # which floors may import each side package
    "parsers": 1,
    "probe": 2,
    "engines": 3,
    "profiler": 3,
}
TOP = {
    "__main__",
    "hydra_entry",
    "bench",
    "tracking",
}  # the command modules: above every floor, imported by nothing of ours
KNOWN: set[tuple[str, str]] = set()  # empty: every arrow points down (a new wrong one fails)


def _package(mod: str) -> str:
    return mod.split(".")[0]


def _allowed(src: str, dst: str) -> bool:
    a, b = _package(src), _package(dst)
    if a == b or dst == "":
        return True
    if b in TOP:
        return False
    if a in TOP:
        return True
    if a in SIDE:
        return b in SIDE[a] or dst in SIDE[a]
    if b in SIDE:
        return FLOOR.get(a, 99) >= SIDE_USERS[b]
    return FLOOR.get(a, 99) >= FLOOR[b]


def _imports(path: Path, mod: str):
    """Every module of ours that ``mod`` imports: each ``import``/``from`` anywhere in the file (module
    level, inside a function, under TYPE_CHECKING), relative ones resolved."""
    tree = ast.parse(path.read_text())
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    for node in ast.walk(tree):
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


def _modules():
    """(dotted name, path) of every module of ours; a package is its ``__init__``."""
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts:
            yield ".".join(parts), path


def edges() -> set[tuple[str, str]]:
    """(importer, imported) for every import between two modules of ours."""
    found = set()
    for mod, path in _modules():
        for dst in _imports(path, mod):
            dst_mod = _module_of(dst)
            if dst_mod and dst_mod != mod:
                found.add((mod, dst_mod))
    return found


def arrows() -> set[tuple[str, str]]:
    """(importer, imported) for every wrong-way import in the package."""
    return {(a, b) for a, b in edges() if not _allowed(a, b)}


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


def circles(graph: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan): each holds at least one circle."""
    nxt: dict[str, list[str]] = {}
    for a, b in sorted(graph):
        nxt.setdefault(a, []).append(b)
        nxt.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in nxt[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in nxt:
        if v not in index:
            visit(v)
    return found


def test_no_module_circle():
    found = circles(edges())
    assert not found, "modules that import each other, counting every import (move the shared piece down): " + (
        "; ".join(" <-> ".join(c) for c in found)
    )


def test_no_package_circle():
    packages = {(_package(a), _package(b)) for a, b in edges() - KNOWN if _package(a) != _package(b)}
    found = circles(packages)
    assert not found, "packages that import each other (besides the KNOWN arrows): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_circles_finds_a_circle():
    assert circles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert circles({("a", "b"), ("b", "c")}) == []


def _names_engine(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ENGINES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_engine(x) for x in node.elts)
    return False


def name_branches() -> list[str]:
    """``module:line`` of every comparison (==, !=, in, not in) or ``case`` with an engine's name in it,
    outside ``engines/``: a decision that belongs to the engine object."""
    found = []
    for mod, path in _modules():
        if _package(mod) == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                hit = any(_names_engine(x) for x in (node.left, *node.comparators))
            elif isinstance(node, ast.MatchValue):
                hit = _names_engine(node.value)
            else:
                continue
            if hit:
                found.append(f"{mod}:{node.lineno}")
    return found


def test_no_branch_on_the_engine_name_outside_engines():
    found = name_branches()
    assert not found, (
        "a branch on the engine's name outside spec_decode/engines/ (ask the engine: "
        "spec_decode.engines.engine.engine_of(cfg), an attribute or method of Engine): " + ", ".join(found)
    )


def test_every_engine_schema_has_an_engine_object():
    assert set(BY_NAME) == set(ENGINES), "core.engine_config.ENGINES and engines.engine.BY_NAME name the same engines"
    assert all(BY_NAME[n].name == n for n in BY_NAME)


def sweep_starts_in_views(pkg: Path = PKG) -> list[str]:
    """``module:function`` of every function in ``views/`` that starts ``run.py`` (a subprocess or exec in a
    function that names run.py), and every view that imports the job runner (``runner.job``)."""
    found = []
    for path in sorted((pkg / "views").glob("*.py")):
        mod = f"views.{path.stem}"
        tree = ast.parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            starts = any(
                isinstance(n, ast.Call) and ast.unparse(n.func).startswith(("subprocess.", "os.exec", "os.spawn"))
                for n in ast.walk(fn)
            )
            names_run_py = any(
                isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith("run.py")
                for n in ast.walk(fn)
            )
            if starts and names_run_py:
                found.append(f"{mod}:{fn.name}")
        found += [f"{mod}: imports {dst}" for dst in _imports(path, mod) if dst.startswith("runner.job")]
    return found


def test_nothing_in_views_runs_a_sweep():
    found = sweep_starts_in_views()
    assert not found, "a view runs a sweep (move it to spec_decode/bench.py; views only read records): " + ", ".join(
        found
    )
