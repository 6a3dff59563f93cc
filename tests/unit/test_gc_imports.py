"""frozen_imports (spec_decode/core/gc_imports.py): the collector off inside, back as it was after, and
the heap frozen only when the block imported a module."""

from __future__ import annotations

import gc
import importlib
import sys

import pytest

from spec_decode.core.gc_imports import frozen_imports


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    """The name of a module no one has imported yet (a file in tmp_path, on sys.path)."""
    (tmp_path / "gc_imports_probe_mod.py").write_text("import gc\nIMPORTED_WITH_GC = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gc_imports_probe_mod", raising=False)
    yield "gc_imports_probe_mod"
    gc.unfreeze()  # this test process's objects back to the collector


def test_an_import_runs_without_the_gc_and_is_frozen_after(fresh_module):
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with frozen_imports():
        mod = importlib.import_module(fresh_module)
    assert mod.IMPORTED_WITH_GC is False
    assert gc.isenabled()
    assert gc.get_freeze_count() > frozen


def test_a_block_that_imports_nothing_new_freezes_nothing():
    gc.unfreeze()
    with frozen_imports():
        import json  # noqa: F401  (loaded long ago)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_collector_stays_off_where_it_was_off_and_inside_a_nested_block(fresh_module):
    with frozen_imports():
        with frozen_imports():
            importlib.import_module(fresh_module)
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with frozen_imports():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_back_when_the_import_fails():
    with pytest.raises(ModuleNotFoundError):
        with frozen_imports():
            import no_such_module_anywhere  # noqa: F401
    assert gc.isenabled()
