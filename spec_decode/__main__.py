"""The one command line: ``spec-decode <command> [args]`` (or ``python -m spec_decode <command>``).

Each command forwards its arguments, unchanged, to the module that owns it; ``spec-decode <command>
--help`` prints that module's own help. ``run`` and ``sweep`` hand over to ``run.py`` (the Hydra
entry point, kept as the one place that composes a job) in the project checkout.

Commands are imported only when chosen (``importlib``), so ``spec-decode --help`` and a mistyped
command answer without loading torch, MLflow or Hydra.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from pathlib import Path

# command -> (module, leading argv for its main, one-line help)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "run": ("run.py", (), "one job (Hydra overrides; same as `python run.py ...`)"),
    "sweep": ("run.py", ("-m",), "a sweep (same as `python run.py -m ...`)"),
    "report": ("spec_decode.views.report", (), "table + plots of a sweep dir, a metrics.json or an MLflow parent run"),
    "compare": (
        "spec_decode.views.experiment",
        ("compare",),
        "two sweeps cell by cell, or a rebuild vs an experiment (metrics, starts)",
    ),
    "bench": ("spec_decode.bench", (), "run an experiment's sweep -> metrics.json (experiment|rebuild|drafters)"),
    "experiment": (
        "spec_decode.views.experiment",
        (),
        "a reported experiment's report, headline and compare (its sweep: `bench`)",
    ),
    "drafters": ("spec_decode.views.drafter_experiments", (), "the drafter experiments' report (their sweep: `bench`)"),
    "sync": ("spec_decode.views.tracking", ("sync",), "upload results.json files that never reached MLflow"),
    "doctor": ("spec_decode.runner.doctor", (), "the self-check: plugin, hook targets, one live request"),
    "probe": ("spec_decode.probe.nccl", (), "NCCL all-reduce latency (device and eager) per size"),
    "serve": ("spec_decode.engines.embedded.__main__", (), "the embedded engine's server (SGLang's flags)"),
    "build": (
        "spec_decode.engines.embedded.build",
        (),
        "build the tiny target or drafter (DVC stages), or a synthetic real-shape pair",
    ),
}

ROOT = Path(__file__).resolve().parents[1]


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items())
    return (
        f"usage: spec-decode <command> [args]\n\ncommands:\n{rows}\n\n"
        "`spec-decode <command> --help` prints the command's own options."
    )


def _run_py(lead: tuple[str, ...], args: list[str]) -> int:
    script = ROOT / "run.py"
    if not script.exists():
        print(
            f"error: {script} not found: `run` and `sweep` need the project checkout (pip install -e . from a clone)",
            file=sys.stderr,
        )
        return 2
    os.execv(sys.executable, [sys.executable, str(script), *lead, *args])
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        print(f"error: unknown command {name!r}{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    module, lead, _ = COMMANDS[name]
    if module == "run.py":
        return _run_py(lead, rest)
    sys.argv = [f"spec-decode {name}", *lead, *rest]
    result = importlib.import_module(module).main([*lead, *rest])
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
