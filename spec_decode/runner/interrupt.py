"""Ctrl-C (SIGINT) at any moment ends cleanly: every MLflow run this process opened ends KILLED, the
sweep's summary says it was interrupted, and the user sees one line instead of a traceback.

``install`` arms the handler as the first thing run.py does. Until ``started`` (imports, the override
check, Hydra composing the config; the sweep's ``on_multirun_start`` and ``run_from_hydra`` call it)
nothing exists to clean up and Ctrl-C simply exits 130. After it, the first SIGINT raises
KeyboardInterrupt where the runner is (the job writes its record KILLED and kills its server tree);
further ones while that cleanup runs are refused with a line saying so, so that the cleanup finishes.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

EXIT_CODE = 130  # the shell's code for "ended by SIGINT"
MESSAGE = "interrupted (Ctrl-C / SIGINT)"

_state: dict[str, Any] = {"started": False, "interrupted": False, "deferred": 0, "pending": False}
_open_runs: dict[str, Any] = {}  # MLflow run id -> the client that opened it


def install() -> None:
    signal.signal(signal.SIGINT, _on_sigint)


def started() -> None:
    """From here on a Ctrl-C has something to clean up: raise instead of exiting."""
    _state["started"] = True


def mark() -> None:
    """Record that the process is being stopped (SIGINT here, SIGTERM in runner.cli)."""
    _state["interrupted"] = True


def interrupted() -> bool:
    return bool(_state["interrupted"])


def _on_sigint(signum: int, frame: Any) -> None:
    if not _state["started"]:
        print(f"\n{MESSAGE}: nothing had started", file=sys.stderr)
        os._exit(EXIT_CODE)  # no run, no server, no file yet: no cleanup to wait for
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
