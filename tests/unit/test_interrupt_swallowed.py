"""A Ctrl-C (or SIGTERM) whose KeyboardInterrupt Python swallows still stops the process.

Python runs a signal handler at the next bytecode boundary; when that falls inside a callback whose
exceptions it ignores (a weakref callback -- importlib's module-lock clean-up is one, which is where a
sweep's Ctrl-C 2.4 s in was lost once in the suite and the sweep ran to its end -- or a ``__del__``),
the raise only prints "Exception ignored in ...". Here a real process receives a real signal inside such a
callback, with the handlers run.py and hydra_entry install, and must see the interrupt in its own code."""

import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.unit

SCRIPT = r"""
import signal, sys, time, weakref
from spec_decode import hydra_entry as cli
from spec_decode.runner import interrupt

interrupt.install()
interrupt.started()
signal.signal(signal.SIGTERM, cli._on_sigterm)
SIG = getattr(signal, sys.argv[1])


class Obj:
    pass


obj = Obj()


def callback(_):  # a weakref callback: Python ignores what it raises
    signal.raise_signal(SIG)  # the handler runs here, at the next bytecode boundary
    total = 0
    for i in range(1000):
        total += i


ref = weakref.ref(obj, callback)
try:
    del obj
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pass
    print("RAN ON")
except KeyboardInterrupt as e:
    print(f"STOPPED {type(e).__name__}: {e}")
"""


@pytest.mark.parametrize(
    ("sig", "expected"),
    [
        ("SIGINT", "STOPPED KeyboardInterrupt: interrupted (Ctrl-C / SIGINT)"),
        ("SIGTERM", "STOPPED Terminated: terminated by SIGTERM"),
    ],
)
def test_an_interrupt_raised_inside_a_callback_that_ignores_it_still_stops_the_process(sig, expected):
    out = subprocess.run([sys.executable, "-c", SCRIPT, sig], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(expected), out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr  # our own interrupt: no traceback for it


def test_other_unraisable_errors_still_reach_the_previous_hook():
    """The hook takes only our interrupts: an ordinary error in a ``__del__`` is printed as before."""
    script = (
        "from spec_decode.runner import interrupt\n"
        "interrupt.install()\n"
        "class Obj:\n"
        "    def __del__(self):\n"
        "        raise ValueError('from __del__')\n"
        "Obj()\n"
        "print('done')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "done"
    assert "Exception ignored in" in out.stderr and "ValueError: from __del__" in out.stderr, out.stderr


def test_a_ctrl_c_during_the_cleanup_after_a_resent_sigterm_does_not_cut_it():
    """The resend's flag is SIGINT's alone: after a swallowed SIGTERM was raised again, a Ctrl-C during the
    cleanup is refused with a line (as after any first interrupt), not raised into the cleanup."""
    cleanup = (
        "\ntry:  # the job's cleanup, and a Ctrl-C during it\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "    print('CLEANUP FINISHED')\n"
        "except KeyboardInterrupt:\n"
        "    print('CLEANUP CUT')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT + cleanup, "SIGTERM"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.splitlines() == [
        "STOPPED Terminated: terminated by SIGTERM (scancel, time limit or kill)",
        "CLEANUP FINISHED",
    ], out.stdout + out.stderr
    assert "again: still ending the runs" in out.stderr, out.stderr
