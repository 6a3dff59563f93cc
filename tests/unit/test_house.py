"""Issue 30's house rules that a reader checks with ``ls`` and ``wc``: no module over 400 lines, the record's
``finish`` a short sequence (under 40 lines), and no function-level import without a stated reason (start-up
cost, code that runs inside SGLang, a cycle it breaks): a comment on the import group or the line above it."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "spec_decode"
MAX_LINES = 400


def _modules():
    return sorted(PKG.rglob("*.py"))


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PKG)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by what they do): {long}"


def test_finish_is_a_short_sequence():
    tree = ast.parse((PKG / "analysis" / "finish.py").read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "finish"]
    assert fn.end_lineno - fn.lineno + 1 < 40


def _import_groups(fn: ast.AST) -> list[list[ast.stmt]]:
    """Runs of import statements on consecutive lines inside one function."""
    nodes = sorted((n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno)
    groups: list[list[ast.stmt]] = []
    for n in nodes:
        if groups and n.lineno == groups[-1][-1].end_lineno + 1:
            groups[-1].append(n)
        else:
            groups.append([n])
    return groups


def unstated_function_imports(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    out = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        groups = _import_groups(fn)
        # one stated reason covers the function's imports (matplotlib.use("Agg") sits between two of them)
        if groups and not any(
            "#" in line for g in groups for line in lines[max(0, g[0].lineno - 2) : g[-1].end_lineno]
        ):
            first = groups[0][0].lineno
            out.append(f"{path.relative_to(PKG.parent)}:{first}: {lines[first - 1].strip()}")
    return sorted(set(out))


def test_every_function_level_import_states_why():
    bad = [x for p in _modules() for x in unstated_function_imports(p)]
    assert not bad, "function-level imports without a reason (a comment on the import or the line above):\n" + (
        "\n".join(bad)
    )
