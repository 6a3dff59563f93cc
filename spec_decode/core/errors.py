"""ConfigError: a configuration that cannot run (raised by the schemas in core/config.py and
core/engine_config.py, caught by run.py and the CLI, which print it and exit 2)."""


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the key and says what to do."""
