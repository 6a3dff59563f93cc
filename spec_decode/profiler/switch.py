"""The profiler's on/off switch: one byte in a file that the runner writes and every rank reads.

The runner creates the file (``SPEC_DECODE_PROFILE_SWITCH`` in the server's environment) before it
starts the server, turns it on for the warmup, off for the timed runs and on again for the profiled
pass after them. Each rank maps the file (``MAP_SHARED``) on its first hooked call and reads byte 0 at
the start of every cycle: one index into a mapping, no system call, so the dormant hooks cost a
Python call each and no more (``benchmarks/profiler_overhead.py`` measures it side by side). On Linux
a ``write()`` to the file and a shared mapping of it see the same page-cache page, so a flip is seen by
every rank's next cycle. Works under SGLang unchanged: the variable reaches every scheduler process as
the rest of the environment does.

Without the variable (the doctor, a hand-started server with ``SPEC_DECODE_PROFILE``) or when the file
is missing, the profiler is always on, as before.
"""

from __future__ import annotations

import mmap
import os

ENV = "SPEC_DECODE_PROFILE_SWITCH"
ON, OFF = b"1", b"0"


def set_switch(path: str | os.PathLike, on: bool) -> None:
    """Runner side: create the file or flip its byte in place (never replace the file: the ranks'
    mappings hold the inode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, ON if on else OFF, 0)
    finally:
        os.close(fd)


class Switch:
    """Rank side: ``on()`` is the byte read through a shared mapping; always on without a file."""

    def __init__(self, path: str | None):
        self.path = path
        self._map: mmap.mmap | None = None
        if path:
            try:
                with open(path, "rb") as f:
                    self._map = mmap.mmap(f.fileno(), 1, mmap.MAP_SHARED, mmap.PROT_READ)
            except (OSError, ValueError):  # missing or empty file: the runner does not drive us
                self._map = None

    @property
    def driven(self) -> bool:
        """Whether a runner drives this switch (else: always on)."""
        return self._map is not None

    def on(self) -> bool:
        m = self._map
        return m is None or m[0] == 49  # ord("1")
