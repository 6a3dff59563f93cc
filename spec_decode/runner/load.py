"""The load protocol (issue 28): each timed run is many requests at once instead of one.

``benchmark.concurrency`` = N **closed-loop** clients, each sending its next request as soon as its last
returned (SGLang bench_serving's ``--max-concurrency`` without a rate), over the prompts of
``benchmark.load_prompts`` (varied lengths; request i gets prompt i mod P, the same in every run and arm);
``benchmark.request_rate`` = an **open loop**: request i is sent at its seeded Poisson arrival time
(exponential gaps of mean 1/rate; the same times for both arms of a pair), at most N in flight.
``benchmark.load_requests`` (default 4 x N) requests per timed run.

What the job's protocol gets back per timed run is one ``RunRecord`` summing the run's requests
(completion tokens, spec counters, histograms) over the run's wall time (first send -> last answer):
``throughput_tok_s`` is the aggregate output tok/s, and the job's statistics and its paired speedup
read it unchanged -- so the speedup is against the baseline **at the same concurrency** (the paired
baseline server runs the same load; a separate baseline job has the same benchmark.* and so its own key).

Before the timed runs each server decodes every load prompt once at batch 1 (the reference pass; it
also warms the batch path). Every request under load must return the tokens of its prompt's reference
(batch invariance), and the spec server's must equal the baseline's at batch 1 (the lossless guard):
``analysis.load.finish`` compares them and replaces the record's one-prompt lossless verdict with this
one.

Per request the record keeps its figures (no token gaps, no ids unless it diverged); per run and pooled:
``analysis.load`` (aggregate and per-request tok/s, TTFT/ITL/TPOT/E2E, accept length per request, the
running batch from the engine's decode log).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from spec_decode.analysis import load as figures
from spec_decode.analysis.load import _MEMORY, PAIRED, SELF
from spec_decode.core.config import BenchmarkConfig
from spec_decode.core.prompts import Prompt, load_prompt_set
from spec_decode.record.measured import LoadRequest, LoadRun
from spec_decode.record.results import JobRecord
from spec_decode.record.typed import ABSENT
from spec_decode.runner.client import Client, RunRecord, output_sha256


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Send times (s from the run's start) of n requests: the first at 0, then exponential gaps of mean 1/rate."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def run_seed(seed: int, launch: int, run: int) -> int:
    """One arrival sequence per (launch, run), shared by both arms of the pair."""
    return seed * 1_000_003 + launch * 1_000 + run


class LoadRunner:
    """The load protocol against one server: ``reference`` (bs 1 pass) and ``__call__`` (one timed run)."""

    def __init__(self, b: BenchmarkConfig, root: Path, client: Client, rec: JobRecord, arm: str, log_path: Path):
        path = Path(b.load_prompts) if Path(b.load_prompts).is_absolute() else root / b.load_prompts
        self.prompts: list[Prompt] = load_prompt_set(path)
        self.b, self.client, self.rec, self.arm, self.log_path = b, client, rec, arm, log_path
        self.n = b.requests_per_run
        self.bodies = [
            client.generate_body(p.text, b.max_new_tokens, b.temperature, b.ignore_eos) for p in self.prompts
        ]
        if not hasattr(rec, _MEMORY):
            setattr(rec, _MEMORY, {SELF: [], PAIRED: []})

    def prompt_of(self, i: int) -> int:
        return i % len(self.prompts)

    def reference(self, launch: int) -> None:
        """Each load prompt once, alone (bs 1): the outputs every request under load must equal."""
        refs = {}
        for p, body in zip(self.prompts, self.bodies):
            r = self.client.generate(body, launch, -1, stream=self.b.stream)
            refs[str(p.index)] = r.output_ids
        this = self.rec.launches[-1]
        this.load_reference = {**(this.load_reference or {}), self.arm: refs}

    def __call__(self, launch: int, run: int, stream: bool = False, timed: bool = True) -> RunRecord:
        """One timed run: ``load_requests`` requests, closed or open loop; their sum as one RunRecord.
        ``timed=False`` (the profiled pass): the same load, kept out of the timed runs' load figures
        and guard; its requests are in ``last_requests``."""
        b = self.b
        arrivals = (
            poisson_arrivals(b.request_rate, self.n, run_seed(b.load_seed, launch, run))
            if b.request_rate is not None
            else None
        )
        lo = self.log_path.stat().st_size if self.log_path.exists() else 0
        done: dict[int, RunRecord] = {}
        sent: dict[int, float] = {}
        t0 = time.perf_counter()
        _drive(
            self.client,
            self.bodies,
            [self.prompt_of(i) for i in range(self.n)],
            b.concurrency,
            arrivals,
            launch,
            run,
            stream,
            done,
            sent,
        )
        wall = time.perf_counter() - t0  # first send -> last answer
        time.sleep(0.05)  # the last decode-log line reaches the file
        hi = self.log_path.stat().st_size if self.log_path.exists() else lo
        reqs = [done[i] for i in range(self.n)]
        self.last_requests = reqs
        if not timed:
            return _aggregate(reqs, launch, run, wall)
        refs = (self.rec.launches[-1].load_reference or {}).get(self.arm) or {}
        entries = []
        for i, r in enumerate(reqs):
            p = str(self.prompt_of(i))
            ref = refs.get(p)
            same = None if ref is None or r.output_ids is None else r.output_sha256 == output_sha256(ref)
            entries.append(
                LoadRequest(
                    i=i,
                    prompt_index=int(p),
                    sent_s=round(sent[i], 5),
                    scheduled_s=round(arrivals[i], 5) if arrivals else None,
                    wall_s=round(r.wall_s, 5),
                    completion_tokens=r.completion_tokens,
                    prompt_tokens=r.prompt_tokens,
                    spec_verify_ct=r.spec_verify_ct,
                    tok_s=round(r.throughput_tok_s, 3),
                    accept_len=figures.request_accept_len(r),
                    ttft_s=r.ttft_s,
                    output_sha256=r.output_sha256,
                    equals_reference=same,
                    # only a diverging request's ids (the guard names the position)
                    output_ids=r.output_ids if same is False else ABSENT,
                )
            )
        getattr(self.rec, _MEMORY)[self.arm].append(reqs)
        this = self.rec.launches[-1]
        this.load_runs = this.load_runs or []
        this.load_runs.append(
            LoadRun(self.arm, run, [lo, hi], **figures.run_figures(reqs, wall), request_entries=entries)
        )
        return _aggregate(reqs, launch, run, wall)


def _drive(
    client: Client,
    bodies: list[dict],
    prompt_of: list[int],
    concurrency: int,
    arrivals: list[float] | None,
    launch: int,
    run: int,
    stream: bool,
    done: dict[int, RunRecord],
    sent: dict[int, float],
) -> None:
    """Send the requests: closed loop (N workers, each taking the next request when its last returned)
    or open loop (each at its arrival time, at most N in flight). Raises the first request's error."""
    errors: list[BaseException] = []
    lock, slots = threading.Lock(), threading.Semaphore(concurrency)
    pending = iter(range(len(prompt_of)))
    t0 = time.perf_counter()

    def send(c: Client, i: int) -> None:
        sent[i] = time.perf_counter() - t0
        done[i] = c.generate(bodies[prompt_of[i]], launch, run, stream=stream)

    def worker() -> None:  # closed loop: one client, one request at a time
        c = Client(client.base_url, client.timeout_s)
        while not errors:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                send(c, i)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                errors.append(e)

    def one(i: int) -> None:  # open loop: one request, then its slot is free
        try:
            send(Client(client.base_url, client.timeout_s), i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            slots.release()

    threads: list[threading.Thread] = []
    if arrivals is None:
        threads = [threading.Thread(target=worker, name=f"load-client-{k}", daemon=True) for k in range(concurrency)]
        for t in threads:
            t.start()
    else:
        for i, at in enumerate(arrivals):
            if errors:
                break
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
            slots.acquire()  # at most `concurrency` in flight: a late slot delays the send (sent_s says so)
            t = threading.Thread(target=one, args=(i,), name=f"load-request-{i}", daemon=True)
            threads.append(t)
            t.start()
    for t in threads:  # short joins: Ctrl-C reaches this thread (the daemons die with the server)
        while t.is_alive():
            t.join(0.2)
    if errors:
        raise errors[0]


def _aggregate(reqs: list[RunRecord], launch: int, run: int, wall_s: float) -> RunRecord:
    """The run's requests as one record: sums over the run's wall time (so tok/s is the aggregate)."""

    def total(key: str) -> int | None:
        vals = [getattr(r, key) for r in reqs]
        return None if any(v is None for v in vals) else sum(vals)

    hists = [r.spec_correct_drafts_histogram for r in reqs]
    hist = None
    if hists and all(h is not None for h in hists):
        width = max(len(h) for h in hists)
        hist = [sum(h[k] for h in hists if k < len(h)) for k in range(width)]
    return RunRecord(
        launch=launch,
        run=run,
        start_wall=min(r.start_wall for r in reqs),
        end_wall=max(r.end_wall for r in reqs),
        wall_s=wall_s,
        prompt_tokens=sum(r.prompt_tokens for r in reqs),
        completion_tokens=sum(r.completion_tokens for r in reqs),
        spec_verify_ct=total("spec_verify_ct"),
        spec_num_correct_drafts=total("spec_num_correct_drafts"),
        spec_num_proposed_drafts=total("spec_num_proposed_drafts"),
        spec_correct_drafts_histogram=hist,
    )
