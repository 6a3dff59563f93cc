"""Every module of the package imports (a merge once left one that did not, and no test imported it)."""

import importlib
import pkgutil

import pytest

import spec_decode

pytestmark = pytest.mark.unit

MODULES = sorted(m.name for m in pkgutil.walk_packages(spec_decode.__path__, "spec_decode."))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:  # a third-party package missing here is not the code's fault
        if (e.name or "").startswith("spec_decode"):
            raise
        pytest.skip(f"{name}: needs {e.name}")
