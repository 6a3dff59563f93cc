"""A rank imports torch without the cyclic GC and freezes what the import built (ranks._rank_main:
~0.1 s of CPU per rank start, ~0.3 s more at a finalizing exit); it must serve with the GC on."""

from __future__ import annotations

import gc

from spec_decode.engines.embedded import ranks, scheduler


def test_a_rank_serves_with_the_gc_on_and_torchs_import_frozen(monkeypatch):
    seen = {}

    def run_rank(*args):
        seen.update(args=args, enabled=gc.isenabled(), frozen=gc.get_freeze_count())

    monkeypatch.setattr(scheduler, "run_rank", run_rank)
    try:
        ranks._rank_main(1, "spec", "cmd", "log")
    finally:
        gc.unfreeze()  # this test process's objects back to the collector
    assert seen["args"] == (1, "spec", "cmd", "log")
    assert seen["enabled"] is True
    assert seen["frozen"] > 0
