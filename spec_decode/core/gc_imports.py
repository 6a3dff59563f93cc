"""Heavy imports without the cyclic GC: ``with frozen_imports(): from mlflow.tracking import ...``.

Importing mlflow (with pandas, sqlalchemy, alembic, opentelemetry), scipy, matplotlib or torch builds
hundreds of thousands of objects that live as long as the process. With the collector on, CPython runs
a full collection each time the old generation has grown by a quarter, so an import that grows the heap
tenfold scans it again and again, and frees almost nothing (modules, functions and classes are not
garbage). A sweep job's run.py spent ~0.6 s of its ~4.5 s of CPU in 7 such full collections, 2,846
modules loaded (docs/testing.md, 2026-12-05, session 3); a rank ~0.4 s of its ~1.5 s on torch's.

Inside the block the collector is off; on leaving it, if the block imported anything, everything
allocated so far is frozen (``gc.freeze()``: moved to the permanent generation, never scanned again),
then the collector is back as it was. Only when the collector runs changes, never what a process
computes. The price: the few cyclic objects an import leaves (and any cyclic garbage not yet collected
at that moment) stay allocated for the process's life, a one-time cost per heavy package, since a block
whose modules are already loaded freezes nothing.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_imports() -> Iterator[None]:
    """The collector off for the block; its newly imported objects (and everything before them) frozen
    after it, if it imported any module. Nests: an inner block leaves the collector off."""
    enabled = gc.isenabled()
    loaded = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) != loaded:
            gc.freeze()
        if enabled:
            gc.enable()
