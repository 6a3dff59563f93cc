"""Ctrl-C (SIGINT) at any moment ends cleanly: every MLflow run this process opened ends KILLED, the
sweep's summary says it was interrupted, and the user sees one line instead of a traceback.

``install`` arms the handler as the first thing run.py does. Until ``started`` (imports, the override
check, Hydra composing the config; the sweep's ``on_multirun_start`` and ``run_from_hydra`` call it)
nothing exists to clean up and Ctrl-C simply exits 130. After it, the first SIGINT raises
KeyboardInterrupt where the runner is (the job writes its record KILLED and kills its server tree);
further ones while that cleanup runs are refused with a line saying so, so that the cleanup finishes.

A raise can be lost: Python runs a signal handler at the next bytecode boundary, and when that falls inside
a callback whose exceptions Python ignores (a weakref callback such as importlib's module-lock clean-up,
a ``__del__``), the KeyboardInterrupt only prints "Exception ignored in ..." and the sweep runs on to its
end (seen once in the test suite: the signal 2.4 s into a sweep, during an import). ``install`` therefore
also sets ``sys.unraisablehook``: an interrupt of ours that was swallowed so is signalled once more
(``_thread.interrupt_main``), and raised where it can reach the runner.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

EXIT_CODE = 130  # the shell's code for "ended by SIGINT"
MESSAGE = "interrupted (Ctrl-C / SIGINT)"
RESEND_S = 0.01  # how long after a swallowed raise the signal is sent again

_state: dict[str, Any] = {
    "started": False,
    "interrupted": False,
    "signum": signal.SIGINT,  # the signal that interrupted (SIGTERM in hydra_entry): the one re-sent
    "redeliver": False,  # the raise was swallowed (``_unraisable``): the next SIGINT raises again
    "deferred": 0,
    "pending": False,
}
_open_runs: dict[str, Any] = {}  # MLflow run id -> the client that opened it


def install() -> None:
    signal.signal(signal.SIGINT, _on_sigint)
    if sys.unraisablehook is not _unraisable:
        _state["next_hook"] = sys.unraisablehook
        sys.unraisablehook = _unraisable


def started() -> None:
    """From here on a Ctrl-C has something to clean up: raise instead of exiting."""
    _state["started"] = True


def mark(signum: int = signal.SIGINT) -> None:
    """Record that the process is being stopped (SIGINT here, SIGTERM in hydra_entry)."""
    _state["interrupted"] = True
    _state["signum"] = signum


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook``: our interrupt raised inside a callback that ignores exceptions is sent again
    (no "Exception ignored" traceback for it); anything else goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _state["interrupted"]:
        # SIGTERM's handler raises every time; SIGINT's raises once, so it is told that this is the resend
        _state["redeliver"] = _state["signum"] == signal.SIGINT
        _resend(_state["signum"])
        return
    _state.get("next_hook", sys.__unraisablehook__)(unraisable)


def _resend(signum: int) -> None:
    """Signal the main thread again, from a short-lived thread a moment later: sent from the main thread
    itself, the handler would run at once, still inside the hook, and the raise be lost once more. Should
    the new raise land in another such callback, the hook sends it again."""
    t = threading.Timer(RESEND_S, _thread.interrupt_main, args=(signum,))
    t.daemon = True
    t.start()


def interrupted() -> bool:
    return bool(_state["interrupted"])


def _on_sigint(signum: int, frame: Any) -> None:
    if not _state["started"]:
        print(f"\n{MESSAGE}: nothing had started", file=sys.stderr)
        os._exit(EXIT_CODE)  # no run, no server, no file yet: no cleanup to wait for
    if _state["redeliver"]:  # our first raise was swallowed (``_unraisable``): raise it again
        _state["redeliver"] = False
        if _state["deferred"]:
            _state["pending"] = True
            return
        raise KeyboardInterrupt(MESSAGE)
    if _state["interrupted"]:
        print(f"\n{MESSAGE} again: still ending the runs as KILLED and stopping servers; one moment", file=sys.stderr)
        return
    mark()
    if _state["deferred"]:
        _state["pending"] = True  # raised when the deferred block ends
        return
    raise KeyboardInterrupt(MESSAGE)


@contextmanager
def deferred() -> Iterator[None]:
    """A block a Ctrl-C must not cut in half (MLflow creating a store's schema: cut, it leaves tables
    that make every later open fail). The interrupt is raised when the block ends."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1
        if not _state["deferred"] and _state["pending"]:
            _state["pending"] = False
            raise KeyboardInterrupt(MESSAGE)


def exit_killed(message: str) -> NoReturn:
    """run.py's end after a Ctrl-C: every run still open ends KILLED, one line, exit 130."""
    end_open_runs("KILLED")
    print(f"\n{message}: open MLflow runs ended KILLED; results.json files kept", file=sys.stderr)
    raise SystemExit(EXIT_CODE) from None


def opened(run_id: str, client: Any) -> None:
    _open_runs[run_id] = client


def closed(run_id: str) -> None:
    _open_runs.pop(run_id, None)


def end_open_runs(status: str = "KILLED", keep: tuple[str, ...] = ()) -> list[str]:
    """End every run still open (a Ctrl-C landed between its creation and its close) with ``status``;
    ``keep``: runs their owner closes itself (the sweep's parent). Returns the ids it ended."""
    ended = []
    for run_id, client in list(_open_runs.items()):
        if run_id in keep:
            continue
        try:
            client.set_terminated(run_id, status=status)
            ended.append(run_id)
        except Exception as e:  # noqa: BLE001 - a store gone: say which run stays open
            print(f"warning: MLflow run {run_id} could not be ended {status}: {e}", file=sys.stderr)
        closed(run_id)
    return ended
