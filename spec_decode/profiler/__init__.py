"""EAGLE-3 phase profiler for SGLang 0.5.23, loaded as an SGLang plugin (entry point group
``sglang.srt.plugins``); active only when ``SPEC_DECODE_PROFILE`` is set in the server's environment."""
