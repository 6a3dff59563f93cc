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
``finish`` compares them and replaces the record's one-prompt lossless verdict with this one.

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
from spec_decode.analysis import lossless
from spec_decode.core.config import BenchmarkConfig
from spec_decode.core.prompts import Prompt, load_prompt_set
from spec_decode.engines.engine import named
from spec_decode.parsers import decode_log
from spec_decode.record.results import JobRecord, performance_only
from spec_decode.runner.client import Client, RunRecord, output_sha256

SELF, PAIRED = "self", "paired_baseline"  # the record's own server, the paired baseline server beside it
_MEMORY = "_load_requests"  # the requests' RunRecords (token gaps, ids) in memory until finish: never written


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
        self.rec.launches[-1].setdefault("load_reference", {})[self.arm] = refs

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
        refs = (self.rec.launches[-1].get("load_reference") or {}).get(self.arm) or {}
        entries = []
        for i, r in enumerate(reqs):
            p = str(self.prompt_of(i))
            ref = refs.get(p)
            same = None if ref is None or r.output_ids is None else r.output_sha256 == output_sha256(ref)
            e = {
                "i": i,
                "prompt_index": int(p),
                "sent_s": round(sent[i], 5),
                "scheduled_s": round(arrivals[i], 5) if arrivals else None,
                "wall_s": round(r.wall_s, 5),
                "completion_tokens": r.completion_tokens,
                "prompt_tokens": r.prompt_tokens,
                "spec_verify_ct": r.spec_verify_ct,
                "tok_s": round(r.throughput_tok_s, 3),
                "accept_len": figures.request_accept_len(r),
                "ttft_s": r.ttft_s,
                "output_sha256": r.output_sha256,
                "equals_reference": same,
            }
            if same is False:
                e["output_ids"] = r.output_ids  # only a diverging request's ids (the guard names the position)
            entries.append(e)
        getattr(self.rec, _MEMORY)[self.arm].append(reqs)
        self.rec.launches[-1].setdefault("load_runs", []).append(
            {
                "arm": self.arm,
                "run": run,
                "log_window": [lo, hi],
                **figures.run_figures(reqs, wall),
                "request_entries": entries,
            }
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


def _running(log_path: Path, windows: list[list[int]], concurrency: int) -> dict | None:
    if not log_path.exists():
        return None
    lines: list[str] = []
    with open(log_path, "rb") as f:
        for lo, hi in windows:
            f.seek(lo)
            lines += f.read(hi - lo).decode(errors="replace").splitlines()
    return figures.running_batch(decode_log.parse_lines(lines), concurrency)


def finish(
    rec: JobRecord, b: BenchmarkConfig, baseline: JobRecord | None, log_path: Path, paired_log_path: Path | None
) -> list[str]:
    """After ``results.finish``: the record's ``load`` section and metrics, the lossless guard of every
    request under load against the baseline's bs-1 outputs; console lines. Forgets the in-memory requests."""
    memory = rec.__dict__.pop(_MEMORY, None) or {SELF: [], PAIRED: []}
    runs = [x for launch in rec.launches for x in launch.get("load_runs", [])]
    section: dict = {}
    for arm, path in ((SELF, log_path), (PAIRED, paired_log_path)):
        mine = [x for x in runs if x["arm"] == arm]
        if not mine or path is None:
            continue
        for x in mine:
            x["running"] = _running(path, [x["log_window"]], b.concurrency)
        reqs = [r for batch in memory[arm] for r in batch]
        s = figures.summarize(
            [{k: v for k, v in x.items() if k != "request_entries"} for x in mine],
            reqs,
            b.concurrency,
            b.request_rate,
            _running(path, [x["log_window"] for x in mine], b.concurrency),
        )
        entries = [e for x in mine for e in x["request_entries"]]
        s["batch_invariance"] = {
            "requests": sum(e["equals_reference"] is not None for e in entries),
            "equal": sum(e["equals_reference"] is True for e in entries),
            "what": "each request's output vs its prompt decoded alone (bs 1) on the same server",
        }
        section[arm] = s
    if SELF not in section:
        return []
    s = section[SELF]
    s["profile_note"] = (
        "the phase profile comes from the profiled pass (the protocol request at bs 1), not from the runs under load"
    )
    if PAIRED in section:
        s["paired_baseline"] = section[PAIRED]
    rec.extra["load"] = s
    rec.metrics.update(figures.metrics_of(s))
    if rec.role == "spec":
        _guard(rec, b, baseline, runs)
    inv = s["batch_invariance"]
    lines = figures.describe(s) + [
        f"  outputs under load equal bs 1 on this server: {inv['equal']} of {inv['requests']}"
    ]
    return lines


def _guard(rec: JobRecord, b: BenchmarkConfig, baseline: JobRecord | None, runs: list[dict]) -> None:
    """The lossless guard under load: every spec request's output vs the baseline's bs-1 output of its
    prompt (the paired baseline server's reference pass in the same launch, else the baseline job's)."""
    job_ref = {}
    if baseline is not None:
        job_ref = next((x["load_reference"].get(SELF) for x in baseline.launches if x.get("load_reference")), {}) or {}
    comparisons = []
    for launch in rec.launches:
        refs = launch.get("load_reference") or {}
        mine, base = refs.get(SELF) or {}, refs.get(PAIRED) or job_ref
        for x in launch.get("load_runs", []):
            if x["arm"] != SELF:
                continue
            for e in x["request_entries"]:
                p = str(e["prompt_index"])
                ids = e.get("output_ids") if e["equals_reference"] is False else mine.get(p)
                comparisons.append(lossless.Comparison(f"load:{p}", ids, base.get(p), b.max_new_tokens))
    verdict = lossless.guard(
        comparisons,
        named(rec.engine.name).exact_outputs,
        b.temperature,
        performance_only(rec),
        has_baseline=bool(job_ref)
        or any("load_reference" in x and PAIRED in x["load_reference"] for x in rec.launches),
    )
    verdict["what"] = "every request under load vs the baseline's output of its prompt at bs 1"
    rec.lossless = verdict
    rec.checks = [c for c in rec.checks if c.name != "lossless_vs_baseline"]
    if (check := lossless.check_of(verdict)) is not None:
        rec.checks.append(check)
    if verdict["checked"]:
        rec.metrics["lossless_match_rate"] = float(verdict["match_rate"])
    elif verdict["verdict"] == "warn":
        rec.warnings.append(f"lossless guard: {verdict['reason']}")
