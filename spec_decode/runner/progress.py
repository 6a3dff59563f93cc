"""Progress on the terminal (tqdm): per job the phase (starting server, warmup, run k/N) and tok/s so
far; per sweep job i/N with elapsed time and ETA. Nothing of the bars when stdout or stderr is not a
terminal (SLURM, CI, a pipe): the logs keep their plain lines. On every console, a terminal or not, a
sweep's jobs announce themselves in plain lines (``SweepClock``): k/N, and an ETA from the finished
jobs' durations."""

from __future__ import annotations

import re
import statistics
import sys
import time
from typing import Callable

from tqdm import tqdm


def on_terminal() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


def job_bar(label: str, total: int, quiet: bool = False) -> tqdm:
    return tqdm(
        total=total,
        desc=label,
        unit="run",
        disable=quiet or not on_terminal(),
        file=sys.stderr,
        leave=False,
        bar_format="{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}",
    )


def phase(bar: tqdm, label: str, what: str, tok_s: list[float] | None = None) -> None:
    """Show the phase; with ``tok_s``, the mean tok/s of the timed runs so far."""
    bar.set_description_str(f"{label} {what}", refresh=False)
    if tok_s:
        bar.set_postfix_str(f"{statistics.fmean(tok_s):.1f} tok/s so far", refresh=False)
    bar.refresh()


def sweep_bar(total: int) -> tqdm:
    return tqdm(
        total=total,
        desc="sweep",
        unit="job",
        disable=not on_terminal(),
        file=sys.stderr,
        position=0,
        bar_format="{desc}: job {n_fmt}/{total_fmt} done, elapsed {elapsed}, ETA {remaining}{postfix}",
    )


def duration(seconds: float) -> str:
    """``41 s``, ``4m06s``, ``1h02m``: a console's reading of a duration."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def what_varies(jobs: list[str]) -> list[str]:
    """Each job's overrides (``k=v,k=v``) cut to the keys whose value differs between the jobs: the axes."""
    items = [re.split(r",(?=[\w.+~@/-]+=)", job) if job else [] for job in jobs]
    values: dict[str, set[str]] = {}
    for job in items:
        for item in job:
            k, _, v = item.partition("=")
            values.setdefault(k, set()).add(v)
    return [",".join(i for i in job if len(values[i.partition("=")[0]]) > 1) for job in items]


class SweepClock:
    """A sweep's k/N and ETA as plain lines: the ETA is the mean duration of the jobs finished so far
    times the jobs still to run (none before the first job ends: nothing to estimate from). ``clock`` is
    the time source (seconds); each line is returned and written to stderr (above a tqdm bar, if any)."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic, quiet: bool = False):
        self.total, self.clock, self.quiet = total, clock, quiet
        self.durations: list[float] = []
        self._started: float | None = None
        self._t0 = clock()

    def _eta(self, jobs_left: int) -> str:
        mean = statistics.fmean(self.durations)
        return f"ETA {duration(mean * jobs_left)} (mean {duration(mean)} per finished job)"

    def start(self, label: str) -> str:
        k = len(self.durations) + 1
        self._started = self.clock()
        left = self.total - k + 1  # this one and the ones after it
        eta = self._eta(left) if self.durations else "ETA after the first job"
        return self._say(f"sweep: job {k}/{self.total} ({label or 'defaults'}) starting; {eta}")

    def end(self) -> str:
        if self._started is None:
            return ""
        now = self.clock()
        self.durations.append(now - self._started)
        self._started = None
        k, left = len(self.durations), self.total - len(self.durations)
        rest = f"{left} to go, {self._eta(left)}" if left > 0 else f"all {k} in {duration(now - self._t0)}"
        return self._say(f"sweep: job {k}/{self.total} done in {duration(self.durations[-1])}; {rest}")

    def _say(self, line: str) -> str:
        if not self.quiet:
            tqdm.write(line, file=sys.stderr)
        return line
