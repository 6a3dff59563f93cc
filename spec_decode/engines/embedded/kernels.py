"""The kernel paths a model build runs on, pinned so that its bits do not depend on the CPU's
instruction set (DVC stages ``target``, ``drafter_data``, ``drafter``, ``drafter_scaling``).

torch 2.13's CPU wheel picks its code per CPU at run time in two libraries that the builds use:
ATen's vectorised kernels (AVX-512 / AVX2 / baseline, ``torch.backends.cpu.get_cpu_capability()``)
and MKL's SGEMM (every matmul of these builds; oneDNN runs no primitive here). Different paths round
differently, so a build on another x86 CPU gave other weights. Pinned, both take the path every x86-64
CPU has. What that costs and what it was checked on: ``benchmarks/build_determinism.py``, README
"DVC".

``--kernels pinned`` (params.yaml ``build.kernels``) makes a build re-execute its own command line
once with ``PINNED_ENV`` set (the libraries read these variables when they load, so setting them
later is too late) and record ``kernels`` in its training.json / data.json. ``--kernels native`` (what
the committed models were built with) leaves dispatch to the CPU and records nothing: its bits are
those of this CPU's instruction set.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

MODES = ("native", "pinned")
PINNED_ENV = {
    # torch's override of its CPU-capability dispatch: the kernels compiled for baseline x86-64, the
    # same code whatever AVX level the CPU has
    "ATEN_CPU_CAPABILITY": "default",
    # MKL's Conditional Numerical Reproducibility: one code path (SSE2) on every Intel or compatible CPU
    # instead of the fastest for this one; reproducible for a fixed thread count (the recipe fixes it)
    "MKL_CBWR": "COMPATIBLE",
}
# MKL's CNR branch numbers (mkl_cbwr.h) -> names, for the record
_MKL_BRANCHES = {
    0: "OFF",
    1: "AUTO_UNSET",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    12: "AVX512",
    14: "AVX512_E1",
}


def add_argument(parser) -> None:
    parser.add_argument(
        "--kernels",
        choices=MODES,
        default="native",
        help="pinned: the kernel paths every x86-64 CPU has (bit-identical across instruction "
        "sets, slower); native: this CPU's own (bit-identical only on the same ISA)",
    )


def requested(argv: list[str]) -> bool:
    """Whether this command line asks for pinned kernels (read before argparse: the pin must be in
    place before torch loads)."""
    for i, arg in enumerate(argv):
        if arg == "--kernels" and i + 1 < len(argv):
            return argv[i + 1] == "pinned"
        if arg.startswith("--kernels="):
            return arg.split("=", 1)[1] == "pinned"
    return False


def pin_process() -> None:
    """With ``--kernels pinned``, re-exec this command with ``PINNED_ENV`` unless it is already set.
    Call first thing under ``if __name__ == "__main__"``, before torch runs any kernel."""
    if not requested(sys.argv) or all(os.environ.get(k) == v for k, v in PINNED_ENV.items()):
        return
    env = {**os.environ, **PINNED_ENV}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def deterministic() -> None:
    """``torch.use_deterministic_algorithms(True)`` for a build, without that function's import of
    inductor's config (it also sets ``torch._inductor.config.deterministic``, for compiled code, which no
    build runs; the import is ~1 s of CPU in every build process). ATen reads the same flag."""
    import torch  # lazy: see _mkl_branch

    torch._C._set_deterministic_algorithms(True, warn_only=False)


def _mkl_branch() -> str | None:
    """MKL's active CNR branch as torch's own MKL reports it, or None when it cannot be read."""
    import torch  # lazy: this module sets the kernel env before torch loads (pin_process)

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        value = lib.mkl_serv_cbwr_get(1)  # MKL_CBWR_BRANCH
    except (OSError, AttributeError):
        return None
    return _MKL_BRANCHES.get(value, str(value))


def state() -> dict:
    """What this process's kernels are: a pinned build's record says which paths made it."""
    import torch  # lazy: see _mkl_branch

    return {"aten_cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": _mkl_branch()}


def record(mode: str) -> dict:
    """The record's ``kernels`` entry: only pinned builds carry one (a native record stays as the
    committed models' training.json, so a native rebuild leaves git clean)."""
    return {"kernels": {"mode": mode, **state()}} if mode == "pinned" else {}


def check(mode: str) -> None:
    """Refuse a pinned build whose pin is not in effect (e.g. ``main()`` called in a process that did
    not go through ``pin_process``): its weights would silently depend on the CPU."""
    if mode != "pinned":
        return
    import torch  # lazy: see _mkl_branch

    cap = torch.backends.cpu.get_cpu_capability()
    mkl = _mkl_branch()
    if cap != "DEFAULT" or mkl not in (None, "COMPATIBLE"):
        raise SystemExit(
            f"--kernels pinned: pin not in effect (ATen capability {cap}, MKL CNR branch {mkl}): "
            f"run the build as `python -m ...` (it sets {PINNED_ENV} itself), set those "
            "variables before torch loads, or use --kernels native"
        )
