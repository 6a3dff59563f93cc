"""The embedded engine, holding its first /generate until RENDEZVOUS_N engines are up and asked to
serve (or RENDEZVOUS_TIMEOUT_S passed), so that jobs which may run at once really do serve at the same
time -- a wrapper at the process boundary, for tests only.

    python tests/slurm/rendezvous_server.py <embedded engine flags>
    env: RENDEZVOUS_DIR=<dir shared by the jobs> RENDEZVOUS_N=2 [RENDEZVOUS_TIMEOUT_S=30]

Each engine leaves a file named after its pid in RENDEZVOUS_DIR when its first request arrives (it is
listening by then, so its port is taken). A job that the slot allocator holds back never arrives; the
others then go on after the timeout, the servers do not overlap, and the test fails.
"""

import os
import runpy
import sys
import time
from pathlib import Path


def main() -> None:
    from spec_decode.engines.embedded import server

    where = Path(os.environ["RENDEZVOUS_DIR"])
    original = server.EngineState.generate
    met = {"done": False}

    def generate(self, body):
        if not met["done"]:
            met["done"] = True
            where.mkdir(parents=True, exist_ok=True)
            (where / str(os.getpid())).touch()
            deadline = time.monotonic() + float(os.environ.get("RENDEZVOUS_TIMEOUT_S", "30"))
            while len(list(where.iterdir())) < int(os.environ["RENDEZVOUS_N"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            print(f"rendezvous: {len(list(where.iterdir()))} engine(s) serving", flush=True)
        return original(self, body)

    server.EngineState.generate = generate
    sys.argv = ["spec_decode.engines.embedded", *sys.argv[1:]]
    runpy.run_module("spec_decode.engines.embedded", run_name="__main__")


if __name__ == "__main__":
    main()
