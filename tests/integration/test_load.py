"""The load protocol (issue 28, spec_decode/runner/load.py) against one real embedded server over HTTP.

- closed loop: N clients keep exactly N requests in flight, counted by the engine itself (its decode
  log's ``#running-req`` + ``#queue-req``), for N = 2 and 4, and every request returns its prompt's
  batch-1 output;
- open loop: the seeded Poisson arrival process has the asked rate (statistical tests with a fixed
  seed), and the runner sends each request at its arrival time.
"""

from __future__ import annotations

import math

import pytest

from spec_decode.analysis.load import running_batch
from spec_decode.parsers.decode_log import parse_lines
from spec_decode.record.measured import Launch
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.runner import load
from spec_decode.runner.client import Client

from ..conftest import ROOT, compose_experiment
from .engine_args import embedded_server, spec_flags

pytestmark = pytest.mark.integration
STEPS = 2
TOKENS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One spec server for the module: decode log every batch, room for 16 running requests."""
    log = tmp_path_factory.mktemp("load") / "server.log"
    with embedded_server(
        log, *spec_flags(STEPS), "--decode-log-interval", "1", "--max-running-requests", "16", "--cpu-threads", "1"
    ) as srv:
        yield srv


def runner(server, *overrides: str) -> tuple[load.LoadRunner, JobRecord]:
    cfg = compose_experiment(f"benchmark.max_new_tokens={TOKENS}", *overrides)
    rec = JobRecord(
        role="spec",
        name="t",
        experiment="t",
        config={},
        config_hash="",
        engine=EngineInfo("embedded"),
        speculative=True,
        launches=[Launch(launch=0, port=0, pid=0, server_start_s=None)],  # the load runs go to it
    )
    return load.LoadRunner(cfg.benchmark, ROOT, Client(server.base_url, 60), rec, load.SELF, server.log_path), rec


@pytest.mark.parametrize("n", [2, 4])
def test_closed_loop_keeps_exactly_n_requests_in_flight_by_the_engines_count(server, n):
    run, rec = runner(server, f"benchmark.concurrency={n}", f"benchmark.load_requests={3 * n}")
    run.reference(0)
    agg = run(0, 0)
    entry = rec.launches[0].load_runs[0]
    lo, hi = entry.log_window
    with open(server.log_path, "rb") as f:
        f.seek(lo)
        lines = parse_lines(f.read(hi - lo).decode().splitlines())
    seen = running_batch(lines, n)
    assert seen is not None and seen.lines >= 10
    # never more than N (a client too many shows N+1), and N most of the time: a finished request's
    # client sends the next at once, so only the run's last wave (and a few cycles between one request's
    # answer and its client's next send) decode fewer
    assert seen.in_flight_max == n, seen
    assert seen.in_flight_median == n, seen
    assert seen.at_concurrency_share >= 0.5, seen
    assert entry.requests == 3 * n and agg.completion_tokens == sum(e.completion_tokens for e in entry.request_entries)
    assert agg.throughput_tok_s == pytest.approx(agg.completion_tokens / entry.wall_s)
    # every request returned its prompt's batch-1 tokens, and each prompt of the varied-length set was used
    assert all(e.equals_reference is True for e in entry.request_entries), entry.request_entries
    assert sorted({e.prompt_index for e in entry.request_entries}) == list(range(min(3 * n, 16)))


def test_poisson_arrivals_have_the_asked_rate():
    rate, n = 5.0, 4000
    t = load.poisson_arrivals(rate, n, seed=7)
    gaps = [b - a for a, b in zip(t, t[1:])]
    mean = sum(gaps) / len(gaps)
    # the mean gap estimates 1/rate with a relative standard error of 1/sqrt(n) (1.6%): 4 SE
    assert abs(mean * rate - 1) < 4 / math.sqrt(len(gaps)), mean
    # exponential, not just the right mean (evenly spaced sends would pass the line above): CV 1, and a
    # Kolmogorov-Smirnov distance below the 1% critical value 1.63/sqrt(n)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1))
    assert abs(sd / mean - 1) < 0.06
    xs = sorted(gaps)
    d = max(
        max(abs((i + 1) / len(xs) - (1 - math.exp(-rate * x))), abs(i / len(xs) - (1 - math.exp(-rate * x))))
        for i, x in enumerate(xs)
    )
    assert d < 1.63 / math.sqrt(len(xs)), d
    assert t[0] == 0.0 and load.poisson_arrivals(rate, n, seed=7) == t  # seeded: the same every time
    assert load.poisson_arrivals(rate, n, seed=8) != t


def test_open_loop_sends_at_the_arrival_times(server):
    run, rec = runner(
        server,
        "benchmark.request_rate=8",
        "benchmark.concurrency=16",
        "benchmark.load_requests=20",
        "benchmark.max_new_tokens=8",
    )
    run(0, 3)
    entries = rec.launches[0].load_runs[0].request_entries
    want = load.poisson_arrivals(8.0, 20, load.run_seed(0, 0, 3))
    assert [e.scheduled_s for e in entries] == [round(w, 5) for w in want]
    late = [e.sent_s - e.scheduled_s for e in entries]
    assert min(late) >= 0 and sorted(late)[len(late) // 2] < 0.05, late  # sent when due, not in a burst
