"""The one command line: every command answers --help, an unknown one gets a did-you-mean."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spec_decode.__main__ import COMMANDS, main

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", [n for n, (m, _, _) in COMMANDS.items() if m != "run.py"])
def test_every_module_command_answers_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_unknown_command_names_the_close_one(capsys):
    assert main(["reprot"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'reprot'" in err and "did you mean `report`" in err


def test_installed_script_forwards_run_to_hydra():
    exe = shutil.which("spec-decode", path=str(Path(sys.executable).parent))
    assert exe, "the spec-decode script is not installed: pip install -e ."
    out = subprocess.run([exe, "run", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "== Configuration groups ==" in out.stdout and "spec: default" in out.stdout, out.stdout[:500]


def _defines_main_without_guard(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    guarded = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    return has_main and not guarded


def test_no_module_with_a_main_is_silent_under_python_m():
    """`python -m spec_decode.X` of a module that has a main() must do something: run it, or say which command
    runs it (views.compare and engines.embedded.synthetic are subcommands' libraries)."""
    silent = [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / "spec_decode").rglob("*.py")) if _defines_main_without_guard(p)
    ]
    assert not silent, f"these define main() but do nothing under python -m: {silent}"


@pytest.mark.parametrize(
    "module, command",
    [
        ("spec_decode.views.compare", "spec-decode compare"),
        ("spec_decode.views.starts", "spec-decode experiment starts"),
    ],
)
def test_a_subcommand_library_names_its_command(module, command):
    out = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and command in out.stderr, (out.returncode, out.stderr)
