"""ConfigError: a configuration that cannot run (raised by the schemas in core/config.py and
core/engine_config.py, caught by run.py and the CLI, which print it and exit 2). run_as: the answer of a
subcommand's library run as ``python -m`` (exit 2, naming the command that runs it)."""

import sys
from typing import NoReturn


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the key and says what to do."""


def run_as(module: str, command: str, module_command: str) -> NoReturn:
    """``python -m <module>`` of a library behind a subcommand: say which command runs it, not nothing."""
    print(f"{module} is run as `{command} ...` (python -m {module_command} ...); see its --help", file=sys.stderr)
    sys.exit(2)
