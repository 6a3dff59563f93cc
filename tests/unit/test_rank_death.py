"""How a rank died, as the server tells it: the same words from every thread that asks.

The rank group's dispatcher and its monitor both see a dead rank at once and both ask how it
died. Two threads joining one process race in multiprocessing: one reaps it, the other's waitpid
gets ECHILD and reads exit code None. CI once logged a SIGKILLed rank that way (the server test
that kills rank 1 then missed "died (signal SIGKILL)"). Real processes, killed for real."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

from spec_decode.engines.embedded.ranks import RankGroup, _OutputCopier


def _sleep_and_talk(out_w) -> None:
    os.write(out_w.fileno(), b"rank 0: serving\n")
    time.sleep(60)


def _group_of_one_sleeper(ctx) -> RankGroup:
    """A RankGroup's failure half on one real process (its ranks' start-up is not what is tested)."""
    group = RankGroup.__new__(RankGroup)
    out_r, out_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_sleep_and_talk, args=(out_w,))
    proc.start()
    out_w.close()
    copier = _OutputCopier(0, out_r)
    copier.start()
    group.procs, group.copiers = [proc], [copier]
    group._deaths, group._reaping = {}, threading.Lock()
    return group


def _ask(group: RankGroup, answers: list[str]) -> None:
    answers.append(str(group._died(0)))


def test_every_thread_that_asks_hears_the_signal_that_killed_the_rank():
    ctx = multiprocessing.get_context("fork")  # cheap: the race is in the parent's reaping
    for _ in range(40):  # unserialised, about 1 round in 3 read "exit code None" here
        group = _group_of_one_sleeper(ctx)
        # killed once it has spoken (its line is what the answer quotes): a fixed 10 ms sleep lost that
        # race on a loaded 2-core machine ("its last log lines: (no output)")
        deadline = time.monotonic() + 10
        while not group.copiers[0].tail and time.monotonic() < deadline:
            time.sleep(0.001)
        answers: list[str] = []
        askers = [threading.Thread(target=_ask, args=(group, answers)) for _ in range(2)]
        os.kill(group.procs[0].pid, signal.SIGKILL)
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        pid = group.procs[0].pid
        assert answers[0] == answers[1]
        assert answers[0].startswith(f"rank 0 (pid {pid}) died (signal SIGKILL)"), answers[0]
        assert "rank 0: serving" in answers[0]  # its last lines, quoted
