"""Per-job work made cheaper for the harness overhead (docs/benchmarks.md) without changing what it
returns. The job's self-check on its warmup request waits for the profiler's flush, and for nothing
else: real files written the way the plugin and the engine write them (a thread stands in for the
plugin's flusher thread, which writes completed cycles up to 50 ms after the server goes idle). The
record's DVC hashes come from dvc.lock parsed once per version of the file."""

import json
import os
import threading
import time

from spec_decode.parsers.profile import rank_path
from spec_decode.record.runs import RunRecord
from spec_decode.runner import doctor
from spec_decode.runner.provenance import dvc_hashes

DECODE_LINE = (
    "[2026-12-01 06:06:15] Decode batch, #running-req: 1, #token: 119, token usage: 0.01, "
    "accept len: 3.00, accept rate: 1.00, cpu graph: False, gen throughput (token/s): 570.41, "
    "#queue-req: 0\n"
)


def warmup_and_files(tmp_path, verify_ct: int = 4):
    """A warmup request that just ended, its server log (one decode line), and its profile lines."""
    end = time.time()
    run = RunRecord(
        launch=0,
        run=-1,
        start_wall=end - 0.5,
        end_wall=end,
        wall_s=0.5,
        prompt_tokens=9,
        completion_tokens=12,
        spec_verify_ct=verify_ct,
    )
    log = tmp_path / "server.log"
    log.write_text(DECODE_LINE)
    lines = "".join(
        json.dumps(
            {
                "t0": end - 0.4 + 0.05 * i,
                "t": end - 0.38 + 0.05 * i,
                "cycle_ms": 20.0,
                "draft_ms": 5.0,
                "verify_ms": 10.0,
                "extend_ms": 5.0,
                "rank": 0,
            }
        )
        + "\n"
        for i in range(verify_ct)
    )
    return run, log, tmp_path / "profile.jsonl", lines


def test_a_late_flush_is_waited_for(tmp_path):
    run, log, prof, lines = warmup_and_files(tmp_path)
    writer = threading.Timer(0.25, lambda: open(rank_path(prof, 0), "w").write(lines))
    t0 = time.monotonic()  # before the timer starts: it fires >= 0.25 s after t0 whatever the load
    writer.start()
    items = doctor.warmup_checks(run, prof, log, 0, speculative=True)
    writer.join()
    assert time.monotonic() - t0 >= 0.25
    assert [(it.name, it.ok) for it in items] == [
        ("profile from rank 0", True),
        ("meta_info spec counters", True),
        ("decode-log lines", True),
    ], items


def test_nothing_more_is_waited_for_once_the_profile_is_on_disk(tmp_path):
    """Flushed already: back at once, also when an item fails for good (a short warmup that wrote no
    decode line: it cost every such job the whole wait, 1 s, in the first version of the poll)."""
    run, log, prof, lines = warmup_and_files(tmp_path)
    open(rank_path(prof, 0), "w").write(lines)
    t0 = time.monotonic()
    assert all(it.ok for it in doctor.warmup_checks(run, prof, log, 0, speculative=True))
    assert time.monotonic() - t0 < 0.2  # the fixed sleep it replaces was 0.3 s
    log.write_text("")  # no decode line
    t0 = time.monotonic()
    items = doctor.warmup_checks(run, prof, log, 0, speculative=True)
    assert time.monotonic() - t0 < 0.2
    assert [it.name for it in items if not it.ok] == ["decode-log lines"]


LOCK = "schema: '2.0'\nstages:\n  build:\n    outs:\n    - path: models/tiny/target\n      md5: {md5}\n"


def test_dvc_lock_is_read_again_when_it_changes(tmp_path):
    """A sweep's jobs share one process: a dvc.lock rewritten between two jobs (dvc repro, a pull) must
    reach the next job's record, even at the same size."""
    lock = tmp_path / "dvc.lock"
    lock.write_text(LOCK.format(md5="a" * 32))
    os.utime(lock, ns=(1_000_000_000, 1_000_000_000))
    assert dvc_hashes(tmp_path) == {"models/tiny/target": "a" * 32}
    lock.write_text(LOCK.format(md5="b" * 32))  # same size
    os.utime(lock, ns=(2_000_000_000, 2_000_000_000))
    assert dvc_hashes(tmp_path) == {"models/tiny/target": "b" * 32}
