"""The worker of test_scale_out's slot-allocator test, in a module of its own: a spawned process imports
the module its target lives in, and the test module imports MLflow (~1.4 s of CPU per child); this one
imports the allocator alone."""

import json
import os
import time
from pathlib import Path

from spec_decode.runner.slots import allocate


def worker(slots_dir, out, hold_s, crash):
    with allocate("gpu", ["0", "1", "2", "3"], 2, Path(slots_dir), timeout_s=60, poll_s=0.02) as mine:
        t0 = time.time()
        if crash:
            os._exit(1)  # dies holding its GPUs
        time.sleep(hold_s)
        with open(out, "a") as f:
            f.write(json.dumps({"slots": mine, "t0": t0, "t1": time.time()}) + "\n")
