"""A fake server launcher for the shutdown-order tests (a double at the process boundary only).

    python tests/fake_launcher.py <out_file> <drain_s|ignore>

Starts one child (a "rank", in the launcher's process group, as SGLang's are), prints READY, then
waits. ``drain_s``: on SIGTERM it drains for that many seconds (writing a line at each second), tells
the child to finish (the child writes its tail), waits for it and exits 0 -- SGLang's graceful path in
miniature. ``ignore``: SIGTERM is ignored, by the launcher and the child. ``die``: the launcher dies at
once on SIGTERM and leaves its child behind (our embedded front), the child drains on SIGTERM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD = r"""
import signal, sys, time
out = sys.argv[1]
def done(*_):
    with open(out, "a") as f:
        f.write("rank tail written\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[2] == "ignore" else done)
print("up", flush=True)
while True:
    time.sleep(0.1)
"""


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    child = subprocess.Popen([sys.executable, "-c", CHILD, out, mode], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "up"  # its handler is in place

    def drain(*_):
        for i in range(int(float(mode))):
            time.sleep(1.0)
            with open(out, "a") as f:
                f.write(f"drained {i + 1} s\n")
        child.terminate()
        child.wait()
        with open(out, "a") as f:
            f.write("launcher done\n")
        sys.exit(0)

    if mode != "die":
        signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else drain)
    print("READY", child.pid, flush=True)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
