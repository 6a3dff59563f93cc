"""Parse-level stand-in for triton (sglang/srt/utils/common.py does a bare `import triton`).

Enough for SGLang's argument parser and plugin registry on a CPU-only CI machine; anything that
really needs triton raises AttributeError. Never on the path outside contract tests.
"""

import types

__version__ = "3.0.0"


class _Dtype:  # torch._dynamo registers triton.language.dtype as a constant type when triton exists
    pass


language = types.ModuleType("triton.language")
language.dtype = _Dtype


def jit(fn=None, **kwargs):
    return fn if fn is not None else (lambda f: f)


def __getattr__(name):
    raise AttributeError(f"triton stub has no attribute {name!r}")
