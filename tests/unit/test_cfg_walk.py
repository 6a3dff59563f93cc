"""Issue 45's walk of ``cfg`` from the job entry: how often a function handed the whole config climbs back
up into it.

The walk starts at ``runner.job.run_job(cfg, ctx)`` (what ``hydra_entry.run_from_hydra`` calls with the
typed config) and follows every call of ours that passes the whole config on (``f(cfg, ...)``,
``f(x, cfg=cfg)``; a callee resolved through the module's imports, ``module.f`` or ``Class.method`` of a
class of ours), into the parameter that receives it, and from there on, transitively. A **climb** is one
read of a part of the whole config inside a reached function below the entry: ``cfg.benchmark`` in
``cfg.benchmark.runs``, ``cfg.hardware`` in ``cfg.hardware.tp_size`` (each ``<param>.<group>`` node counts
once, wherever it appears in the function). A callee handed ``cfg.benchmark`` instead of ``cfg`` is not
walked into: it was given the part it reads.

The measure is the number of **climbing functions**: reached functions with at least one climb. On main
before this step of issue 45 (d7893e5) it was 44 (180 climbs in all; the issue's "42" is its own count of
the same thing, this one is exact and repeatable: ``python tests/unit/test_cfg_walk.py [PKG_DIR]`` prints
every reached function and its climbs). Both bounds below may only go down.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "spec_decode"
ENTRY = ("runner.job", "run_job", "cfg")
MAX_CLIMBING = 30  # functions (44 on d7893e5)
MAX_CLIMBS = 174  # reads of a part of cfg in them (180 on d7893e5)


class Index:
    """Every module's top-level functions and classes' methods, and what its imports name."""

    def __init__(self, pkg: Path):
        self.pkg = pkg
        self.funcs: dict[tuple[str, str], ast.FunctionDef] = {}  # (module, "f" | "Class.m") -> def
        self.imports: dict[str, dict[str, str]] = {}  # module -> local name -> "module" or "module:attr"
        for path in sorted(pkg.rglob("*.py")):
            rel = path.relative_to(pkg).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mod = ".".join(parts)
            tree = ast.parse(path.read_text())
            names: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spec_decode"):
                    base = node.module.removeprefix("spec_decode").lstrip(".")
                    for a in node.names:
                        full = f"{base}.{a.name}" if base else a.name
                        names[a.asname or a.name] = (
                            full
                            if (pkg / full.replace(".", "/")).exists()
                            or (pkg / (full.replace(".", "/") + ".py")).exists()
                            else f"{base}:{a.name}"
                        )
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.startswith("spec_decode.") and a.asname:
                            names[a.asname] = a.name.removeprefix("spec_decode.")
            self.imports[mod] = names
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.funcs[(mod, node.name)] = node
                elif isinstance(node, ast.ClassDef):
                    for m in node.body:
                        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            self.funcs[(mod, f"{node.name}.{m.name}")] = m

    def _first(self, mod: str, name: str) -> list[tuple[str, str]]:
        return [(mod, x) for x in (name, f"{name}.__init__") if (mod, x) in self.funcs][:1]

    def resolve(self, mod: str, func: ast.expr) -> list[tuple[str, str]]:
        """The (module, name) of each function of ours a call may run: a plain name or ``module.f`` through
        the module's imports (a class: its ``__init__``); a method on an object (``engine.flags(cfg)``):
        every method of that name in our classes (the call may dispatch to any of them)."""
        names = self.imports.get(mod, {})
        if isinstance(func, ast.Name):
            target = names.get(func.id, "")
            if ":" in target:
                return self._first(*target.split(":"))
            return self._first(mod, func.id)
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner in names and ":" not in names[owner]:  # module.f
                return self._first(names[owner], func.attr)
            return [k for k in self.funcs if k[1].endswith(f".{func.attr}") and "." in k[1]]
        return []


def _param_for(fn: ast.FunctionDef, call: ast.Call, name: str) -> str | None:
    """The callee's parameter that receives the caller's ``name`` in ``call``."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id == name and i < len(params):
            return params[i]
    for kw in call.keywords:
        if isinstance(kw.value, ast.Name) and kw.value.id == name and kw.arg:
            return kw.arg
    return None


def walk(pkg: Path = PKG) -> dict[str, int]:
    """``module:function`` -> its climbs, for every function the whole cfg reaches below the entry."""
    index = Index(pkg)
    seen: set[tuple[str, str, str]] = set()
    climbs: dict[str, int] = {}
    todo = [ENTRY]
    while todo:
        mod, name, param = todo.pop()
        if (mod, name, param) in seen or (mod, name) not in index.funcs:
            continue
        seen.add((mod, name, param))
        fn = index.funcs[(mod, name)]
        if (mod, name, param) != ENTRY:
            climbs[f"{mod}:{name}"] = climbs.get(f"{mod}:{name}", 0) + sum(
                isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == param
                for n in ast.walk(fn)
            )
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            for callee in index.resolve(mod, call.func):
                p = _param_for(index.funcs[callee], call, param)
                if p is not None:
                    todo.append((*callee, p))
    return climbs


def test_the_walk_of_cfg_climbs_back_up_no_more_than_the_bound():
    found = walk()
    climbing = {k: v for k, v in found.items() if v}
    total = sum(found.values())
    worst = ", ".join(f"{k} {v}" for k, v in sorted(climbing.items(), key=lambda kv: -kv[1])[:10])
    hint = "hand the callee the part it reads (cfg.benchmark, cfg.nccl) instead of the whole config: "
    assert len(climbing) <= MAX_CLIMBING, f"{len(climbing)} functions below run_job climb into cfg: {hint}{worst}"
    assert total <= MAX_CLIMBS, f"{total} climbs back up into cfg below run_job: {hint}{worst}"


def test_the_walk_counts_a_planted_climb(tmp_path):
    pkg = tmp_path / "spec_decode"
    (pkg / "runner").mkdir(parents=True)
    (pkg / "runner" / "job.py").write_text(
        "from spec_decode.runner.deep import deeper\n"
        "def run_job(cfg, ctx):\n    helper(cfg.benchmark)\n    deeper(1, cfg)\n"
        "def helper(b):\n    return b.runs\n"
    )
    (pkg / "runner" / "deep.py").write_text("def deeper(x, c):\n    return c.benchmark.runs + c.hardware.tp_size\n")
    assert walk(pkg) == {"runner.deep:deeper": 2}


if __name__ == "__main__":
    found = walk(Path(sys.argv[1]) if len(sys.argv) > 1 else PKG)
    for k, v in sorted(found.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{v:4d}  {k}")
    print(
        f"{sum(found.values())} climbs in {sum(v > 0 for v in found.values())} climbing functions ({len(found)} reached)"
    )
