#!/usr/bin/env bash
# The real SGLang 0.5.23 for contract tests, without its GPU stack: the package itself (--no-deps) and
# the few modules its argument parser and request schema import. triton is stubbed in tests/contract.
set -euo pipefail
python -m pip install -q --no-deps sglang==0.5.23
python -m pip install -q msgspec orjson pybase64 pyzmq ipython pillow aiohttp starlette pydantic packaging
# SGLang's own clients, run against the embedded engine (tests/integration/test_engine_clients.py via
# tests/sglang_client.py): bench_serving imports `datasets`; the OpenAI client at sglang's pin.
python -m pip install -q "openai==2.8.0" datasets
