"""The one command line: every command answers --help, an unknown one gets a did-you-mean."""

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
