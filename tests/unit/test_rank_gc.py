"""A rank imports torch without the cyclic GC and freezes what the import built (ranks._rank_main:
~0.1 s of CPU per rank start, ~0.3 s more at a finalizing exit); it must serve with the GC on."""

from __future__ import annotations

import gc
import sys

from spec_decode.engines.embedded import ranks

# A stand-in for the scheduler module, found first on the package's path: its import records whether
# the collector ran during it, its run_rank the state the rank serves in.
FAKE_SCHEDULER = """
import gc
IMPORTED_WITH_GC = gc.isenabled()
seen = {}
def run_rank(*args):
    seen.update(args=args, enabled=gc.isenabled(), frozen=gc.get_freeze_count())
"""


def test_a_rank_imports_its_scheduler_without_the_gc_and_serves_with_it_on_and_the_import_frozen(tmp_path, monkeypatch):
    import spec_decode.engines.embedded as package

    (tmp_path / "scheduler.py").write_text(FAKE_SCHEDULER)
    monkeypatch.setattr(package, "__path__", [str(tmp_path), *package.__path__])
    monkeypatch.delitem(sys.modules, "spec_decode.engines.embedded.scheduler", raising=False)
    assert gc.isenabled()
    try:
        ranks._rank_main(1, "spec", "cmd", "log")
    finally:
        gc.unfreeze()  # this test process's objects back to the collector
    fake = sys.modules["spec_decode.engines.embedded.scheduler"]
    assert fake.__file__ == str(tmp_path / "scheduler.py")
    assert fake.IMPORTED_WITH_GC is False
    assert fake.seen["args"] == (1, "spec", "cmd", "log")
    assert fake.seen["enabled"] is True
    assert fake.seen["frozen"] > 0
