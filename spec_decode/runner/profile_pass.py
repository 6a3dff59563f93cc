"""The profiled pass: the profiler's hooks dormant in the timed runs, on in a pass after them.

    arm(extra_env)                 # before the launch: switch on (start-up, warmup: the self-check)
    after_warmup(...)              # the self-check on the warmup's lines, then switch off
    ... timed runs: hooks installed, dormant (one byte read per cycle) ...
    run(b, gen, rec, ...)          # last launch: benchmark.profile_pairs pairs (on, dormant), ABBA

The switch is the one-byte file of ``spec_decode.profiler.switch`` (``SPEC_DECODE_PROFILE_SWITCH`` in
the server's environment, set by ``engines.server_extra_env`` with ``benchmark.profile``). The pass
sends the timed protocol's run (under load: the load, at the job's concurrency); its profiled requests'
windows select the profile's cycles
(``analysis.finish.finish``), and each pair (one profiled run beside one dormant run) gives the
profiler's own effect on tok/s (``analysis.profiler_effect``). Without the switch variable nothing
here does anything (``benchmark.profile=false``, the baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spec_decode.core.config import BenchmarkConfig
from spec_decode.profiler.switch import ENV, set_switch
from spec_decode.record.measured import ProfilePass
from spec_decode.record.results import JobRecord
from spec_decode.record.runs import RunRecord
from spec_decode.runner import doctor


def arm(extra_env: dict[str, str]) -> None:
    """Before a launch: the switch file exists and is on (the server's start-up and warmup cycles are
    profiled: nothing is timed there, and the self-check reads them)."""
    if path := extra_env.get(ENV):
        set_switch(path, True)


def after_warmup(
    rec: JobRecord,
    b: BenchmarkConfig,
    speculative: bool,
    warmup,
    log_path: Path,
    log_start: int,
    launch: int,
    extra_env: dict[str, str],
) -> None:
    """The doctor's live items on the first launch's warmup request (profile lines from rank 0 with
    every phase, meta_info counters, decode-log lines; a failure is a warning, the job still
    measures), then the switch off: the timed runs run with dormant hooks."""
    if launch == 0 and b.warmup and b.profile and warmup is not None:
        interval = (rec.config.get("engine") or {}).get("decode_log_interval")  # a line due after so many batches
        items = doctor.warmup_checks(
            warmup, log_path.parent / "profile.jsonl", log_path, log_start, speculative, interval
        )
        rec.doctor = items  # record.payloads.DoctorItem each
        for it in items:
            if not it.ok:
                rec.warnings.append(
                    f"self-check failed: {it.name}: {it.detail}" + (f" -- what to do: {it.fix}" if it.fix else "")
                )
    if path := extra_env.get(ENV):
        set_switch(path, False)


def run(
    b: BenchmarkConfig,
    gen: Callable[..., RunRecord],
    rec: JobRecord,
    launch: int,
    extra_env: dict[str, str],
    check_alive,
) -> None:
    """After the timed runs of the last launch: ``benchmark.profile_pairs`` pairs of the timed
    protocol's run (``gen(launch, run, stream=)``: the one request, or under load the whole load at the
    job's concurrency, so the profile sees the batches the timed runs ran), one with the profiler on and
    one dormant, in ABBA order (neither state always first). The profiled runs go to
    ``rec.profiled_runs`` (under load: each its load's aggregate, and its requests to
    ``rec.profiled_requests``); the dormant ones' tok/s to ``rec.profile_pass``."""
    path = extra_env.get(ENV)
    if not path or launch != b.launches - 1:
        return
    on_runs, off_runs = [], []
    try:
        for i in range(b.profile_pairs):
            for on in (True, False) if i % 2 == 0 else (False, True):
                set_switch(path, on)
                r = gen(launch, i, stream=b.stream, **({"timed": False} if b.under_load else {}))
                (on_runs if on else off_runs).append(r)
                if on and b.under_load:
                    rec.profiled_requests += gen.last_requests
                check_alive()
    finally:
        set_switch(path, False)
    rec.profiled_runs = on_runs
    rec.profile_pass = ProfilePass(
        pairs=len(on_runs),
        order="ABBA: (on, dormant), (dormant, on), ...",
        launch=launch,
        dormant_tok_s=[r.throughput_tok_s for r in off_runs],
    )
