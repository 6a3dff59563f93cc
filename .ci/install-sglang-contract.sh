#!/usr/bin/env bash
# The real SGLang packages for contract tests (tests/contract/), without their GPU stack.
#
# 0.5.23: the package itself (--no-deps) and the few modules its argument parser and request schema
# import. triton is stubbed in tests/contract.
#
# 0.5.17 (the release that runs on the lent H200's torch 2.11): its wheel is cp312-only, so pip will not
# install it into CI's Python 3.11. Its Python source is version-neutral, so the wheel is downloaded
# (--no-deps, for 3.12) and only its .py files and dist-info are unpacked into <venv>/sglang-0.5.17/.
# Nothing imports it: the contract tier reads that source (tests/contract/test_sglang_versions.py).
set -euo pipefail
python -m pip install -q --no-deps sglang==0.5.23
python -m pip install -q msgspec orjson pybase64 pyzmq ipython pillow aiohttp starlette pydantic packaging
# SGLang's own clients, run against the embedded engine (tests/integration/test_engine_clients.py via
# tests/sglang_client.py): bench_serving imports `datasets`; the OpenAI client at sglang's pin.
python -m pip install -q "openai==2.8.0" datasets

v0517="$(python -c 'import sys; print(sys.prefix)')/sglang-0.5.17"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
  --platform manylinux_2_34_x86_64 -d "$tmp" sglang==0.5.17
rm -rf "$v0517"
python - "$tmp"/sglang-0.5.17-*.whl "$v0517" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    keep = [n for n in z.namelist() if (n.startswith("sglang/") and n.endswith(".py")) or n.startswith("sglang-0.5.17.dist-info/")]
    z.extractall(dest, keep)
print(f"sglang 0.5.17: {len(keep)} files of its wheel unpacked into {dest}")
PY
