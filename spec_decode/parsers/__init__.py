"""Parsers for what servers write: SGLang decode-log lines and per-cycle profile JSON lines."""
