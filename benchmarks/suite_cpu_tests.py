"""A pytest plugin for benchmarks/suite_cpu.py --tests: each test's start and end (CLOCK_BOOTTIME, the clock of
/proc/<pid>/stat's starttime) and the pid that ran it, one JSON line each, appended to $SUITE_CPU_TESTLOG. The
sampler then gives every process the test during which it started (on the process that ran it)."""

from __future__ import annotations

import json
import os
import time


def _write(**fields) -> None:
    path = os.environ.get("SUITE_CPU_TESTLOG")
    if path:
        line = json.dumps({"pid": os.getpid(), "t": time.clock_gettime(time.CLOCK_BOOTTIME), **fields}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: the workers' lines never interleave
        finally:
            os.close(fd)


def pytest_runtest_logstart(nodeid, location):
    _write(start=nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _write(end=nodeid)
