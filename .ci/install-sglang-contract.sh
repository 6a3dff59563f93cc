#!/usr/bin/env bash
# The real SGLang 0.5.23 for contract tests, without its GPU stack: the package itself (--no-deps) and
# the few modules its argument parser and request schema import. triton is stubbed in tests/contract.
set -euo pipefail
python -m pip install -q --no-deps sglang==0.5.23
python -m pip install -q msgspec orjson pybase64 pyzmq ipython pillow aiohttp starlette pydantic packaging
