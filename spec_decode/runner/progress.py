"""Progress on the terminal (tqdm): per job the phase (starting server, warmup, run k/N) and tok/s so
far; per sweep job i/N with elapsed time and ETA. Nothing when stdout or stderr is not a terminal
(SLURM, CI, a pipe): the logs keep their plain lines."""

from __future__ import annotations

import statistics
import sys

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
