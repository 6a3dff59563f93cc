"""A build's deterministic algorithms (``kernels.deterministic``): the flag ATen reads is set, and
inductor's config is not imported for it (``torch.use_deterministic_algorithms`` imports it, ~1 s of CPU
in every build process, for compiled code that no build runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_deterministic_sets_the_flag_without_loading_inductor():
    code = (
        "import sys, torch\n"
        "from spec_decode.engines.embedded import kernels\n"
        "assert not torch.are_deterministic_algorithms_enabled()\n"
        "kernels.deterministic()\n"
        "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
        " 'torch._inductor' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"]
