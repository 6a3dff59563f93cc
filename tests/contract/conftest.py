"""Contract tests run against the installed SGLang 0.5.23 (``pip install sglang==0.5.23 --no-deps``
plus a minimal import set; .ci/install-sglang-contract.sh). They skip when it is absent."""

import sys
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "stubs"


@pytest.fixture(scope="session")
def sglang_args():
    pytest.importorskip("msgspec")
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(STUBS))  # parse-level tests need only `import triton` to succeed
    sglang = pytest.importorskip("sglang")
    from sglang.srt.server_args import prepare_server_args

    assert sglang.__version__ == "0.5.23", f"contract tests pin sglang 0.5.23, found {sglang.__version__}"
    return prepare_server_args


@pytest.fixture(scope="session")
def api_types():
    """sglang/api/v1/api_types.py loaded by file path (no heavy sglang/__init__)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang not installed")
    pytest.importorskip("msgspec")
    path = Path(list(spec.submodule_search_locations)[0]) / "api" / "v1" / "api_types.py"
    mspec = importlib.util.spec_from_file_location("sglang_api_types_contract", path)
    mod = importlib.util.module_from_spec(mspec)
    sys.modules[mspec.name] = mod
    mspec.loader.exec_module(mod)
    return mod
