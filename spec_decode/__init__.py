"""spec-decode-bench: reproducible speculative-decoding experiments."""

__version__ = "0.1.0"
