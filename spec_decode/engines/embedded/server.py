"""The embedded engine's HTTP front: SGLang 0.5.23's endpoints and fields, served by the front process
that feeds the rank processes (``ranks.RankGroup``); ``EngineState`` does what each route asks, the
handler (routes, limits, status codes) and the serving loop are ``handler``'s (``make_handler``, ``serve``):
the arrow runs handler -> server only.

- ``GET /health`` (and ``/health_generate``, ``/ready``): 200 while every rank is alive, else 503.
- ``GET /server_info`` (and the deprecated ``/get_server_info``): resolved args, ``tokenizer_path``,
  version (:func:`engine_version`), tp_size, the rank processes' pids, CUDA graphs (``cuda_graph``,
  ``cuda_graph_bs``, ``cuda_graph_error``), internal state (``effective_max_running_requests_per_dp``).
- ``GET /model_info`` (and ``/get_model_info``): absolute model and tokenizer paths.
- ``GET /metrics``: Prometheus text (metrics.py). ``/v1/completions``, ``/v1/chat/completions``,
  ``/v1/models``: OpenAI's schema (openai_api.py, over ``generate_batch`` / ``stream_batch``).
- ``GET|POST /flush_cache``: resets the speculative counters (as SGLang's ``reset_metrics``); waits
  for a running request to finish first.
- ``POST /generate``: ``{"text" | "input_ids", "sampling_params": {...}}`` -> ``{"text", "output_ids",
  "meta_info"}``, ``meta_info`` with SGLang 0.5.23's keys in its order (``id``, ``finish_reason``,
  ``prompt_tokens``, ``weight_version``, ``num_retractions``, ``reasoning_tokens``,
  ``completion_tokens``, ``cached_tokens``, on finish ``e2e_latency``) and its ``spec_*`` counters (and
  ``spec_correct_drafts_histogram``) when speculation is on. A batch (``text`` a list of strings,
  ``input_ids`` a list of lists, a list of one too) is submitted at once and answered as a list in its
  order (SGLang's ``_handle_batch_request``). Bad bodies get 400 naming the field (``request.py``); a
  known path with another method 405; an unknown path 404.
- ``"stream": true``: SGLang 0.5.23's server-sent events (``http_server.py`` ``serve_generate_request``,
  ``tokenizer_manager.py`` ``_handle_batch_output`` / ``_stream_one_response``): ``text/event-stream``
  (chunked transfer encoding, as uvicorn sends it), one ``data: {json}\n\n`` event after the prefill
  and after each decode step / verify cycle, then ``data: [DONE]\n\n``. Every event holds the
  *cumulative* ``text`` and ``output_ids`` (SGLang's default, ``--incremental-streaming-output`` off) and
  ``meta_info`` with the cumulative ``completion_tokens`` and ``finish_reason: null``; the last event
  is the finished response (``finish_reason``, ``e2e_latency`` and the ``spec_*`` counters, as
  non-stream). A streamed batch interleaves its prompts' events, each with the prompt's ``index``
  (SGLang's ``_stream_batch_responses``), then one ``[DONE]``. The decode loop never waits for the
  client: a slow reader gets the newest state, several steps in one event (SGLang coalesces the same
  way). An error after the events began is an
  ``data: {"error": ...}`` event before ``[DONE]`` (SGLang's shape). A client that leaves mid-stream
  does not stop the generation (it finishes within max_new_tokens).
- A rank that dies: the request in flight gets 503 naming the rank, and the server exits (status 1)
  within about a second, after that rank's last log lines.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

from spec_decode import __version__
from spec_decode.engines.embedded.metrics import Metrics
from spec_decode.engines.embedded.ranks import RankDied, RankGroup
from spec_decode.engines.embedded.request import GenerateBatch, GenerateRequest, RequestError, parse_batch
from spec_decode.engines.embedded.tokenizer import decode

log = logging.getLogger("spec_decode.embedded")
EXIT_RANK_DIED = 1


class EngineState:
    def __init__(self, group: RankGroup, args: dict, context: int, steps: int, speculative: bool):
        self.group = group
        self.args = args
        self.context, self.steps, self.speculative = context, steps, speculative
        self.started = time.time()
        self.internal_state = {"last_gen_throughput": 0.0, "avg_spec_accept_length": None}
        self.in_flight = 0
        self.idle = threading.Condition()
        model = str(args.get("model_path", ""))
        # SGLang's default served_model_name is --model-path as given; clients send it back as `model`
        self.served_model_name = model
        self.model_dir = str(Path(model).resolve()) if model else ""  # its tokenizer files live there too
        self.version = engine_version()
        self.metrics = Metrics(model)

    # ---- /generate ------------------------------------------------------------------------------
    def parse(self, body: object) -> GenerateBatch:
        return parse_batch(body, self.context, self.steps)

    def generate(self, req: GenerateRequest) -> dict:
        return self._generate_all([req])[0]

    def generate_batch(self, batch: GenerateBatch) -> list[dict]:
        """A batch's answers, in its order: all submitted at once (the ranks batch them, as SGLang's
        scheduler batches a batch's requests); one request goes through ``generate``."""
        if len(batch.reqs) == 1:
            return [self.generate(batch.reqs[0])]
        return self._generate_all(batch.reqs)

    def _generate_all(self, reqs: list[GenerateRequest]) -> list[dict]:
        t0 = time.perf_counter()
        # RidInFlight (a 400) is raised by the submit that meets it, before any answer is awaited
        waiting = [(rid, self._submit(req, rid, stream=False)) for req, rid in zip(reqs, self._rids(reqs))]
        outs = []
        for rid, waiter in waiting:
            out = waiter.wait()
            self.internal_state = out["internal_state"]
            outs.append(self._response(out["generation"], time.perf_counter() - t0, rid))
        return outs

    def _rids(self, reqs: list[GenerateRequest]) -> list[str]:
        return [req.rid or uuid.uuid4().hex for req in reqs]

    def _submit(self, req: GenerateRequest, rid: str, stream: bool, on_chunk=None):
        return self.group.submit("generate", req.input_ids, req.max_new_tokens, stream, on_chunk=on_chunk, rid=rid)

    def stream(self, req: GenerateRequest) -> Iterator[dict]:
        return self.stream_batch(GenerateBatch([req]))

    def stream_batch(self, batch: GenerateBatch) -> Iterator[dict]:
        """The events of a streamed request or batch: cumulative states, each request's last one
        finished; a batch's events carry the prompt's ``index`` (SGLang's ``_stream_batch_responses``).
        The requests are submitted here, before the caller sends its 200 (a rid in flight raises
        RidInFlight: a 400); a thread per request waits for the ranks and only appends to its feed;
        the returned generator sends the newest states whenever its consumer (the HTTP writer) comes
        back for more."""
        cond = threading.Condition()  # one for the batch's feeds: the writer waits for any of them
        t0 = time.perf_counter()
        items = []
        for req, rid in zip(batch.reqs, self._rids(batch.reqs)):
            feed = _Feed(cond)
            waiter = self._submit(req, rid, stream=True, on_chunk=feed.add)

            def drive(waiter=waiter, feed=feed) -> None:
                try:
                    feed.finish(waiter.wait())
                except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
                    feed.fail(e)

            threading.Thread(target=drive, name=f"generate-{rid[:8]}", daemon=True).start()
            items.append((req, rid, feed))
        return self._events(items, cond, t0, batch.batched)

    def _events(self, items: list, cond: threading.Condition, t0: float, batched: bool) -> Iterator[dict]:
        sent = [0] * len(items)
        open_ = list(range(len(items)))
        while open_:
            with cond:  # snapshots under the lock, sent after it: a slow client never blocks a feed
                while True:
                    due = [(i, *items[i][2].due(sent[i], items[i][0].stream_interval)) for i in open_]
                    due = [d for d in due if d[1] is not None]
                    if due:
                        break
                    cond.wait()
            for i, ids, done in due:
                req, rid, feed = items[i]
                if done:
                    open_.remove(i)
                    if feed.error is not None:
                        raise feed.error
                    # when the generation ended, not when this writer got to it (SGLang's)
                    self.internal_state = feed.result["internal_state"]
                    out = self._response(feed.result["generation"], feed.done_at - t0, rid)
                else:
                    sent[i] = len(ids)
                    out = {
                        "text": decode(ids),
                        "output_ids": ids,
                        "meta_info": self._meta(rid, None, len(req.input_ids), len(ids)),
                    }
                yield {**out, "index": i} if batched else out

    @staticmethod
    def _meta(rid: str, finish_reason: dict | None, prompt_tokens: int, completion_tokens: int) -> dict:
        # tokenizer_manager.py 2507-2557: the keys, in SGLang 0.5.23's order
        return {
            "id": rid,
            "finish_reason": finish_reason,
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": completion_tokens,
            "cached_tokens": 0,
        }

    def _response(self, gen: dict, latency: float, rid: str | None = None) -> dict:
        ids = gen["output_ids"]
        meta = self._meta(
            rid or uuid.uuid4().hex, {"type": "length", "length": len(ids)}, gen["prompt_tokens"], len(ids)
        )
        meta["e2e_latency"] = latency
        if self.speculative and gen["verify_ct"] > 0:
            meta.update(
                spec_verify_ct=gen["verify_ct"],
                spec_accept_length=len(ids) / gen["verify_ct"],
                spec_accept_rate=gen["correct_drafts"] / gen["proposed_drafts"],
                spec_num_correct_drafts=gen["correct_drafts"],
                spec_num_proposed_drafts=gen["proposed_drafts"],
                spec_correct_drafts_histogram=gen["histogram"],
            )
        self.metrics.finished(gen["prompt_tokens"], len(ids), latency, gen["verify_ct"] if self.speculative else 0)
        return {"text": decode(ids), "output_ids": ids, "meta_info": meta}

    # ---- other endpoints ------------------------------------------------------------------------
    def flush(self, query: dict) -> str:
        timeout = query.get("timeout", ["0"])[-1]
        try:
            if not float(timeout) >= 0:
                raise ValueError
        except ValueError:
            raise RequestError(f"flush_cache: timeout must be a number of seconds >= 0 (got {timeout!r})") from None
        # Rank 0 answers once no request is running or waiting (SGLang's condition).
        self.internal_state = self.group.call("flush")["internal_state"]
        return "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"

    def server_info(self) -> dict:
        graphs = all(r.get("cuda_graph", False) for r in self.group.ready)
        running = self.args.get("max_running_requests", self.group.spec.max_running_requests)
        return {
            **self.args,
            "tokenizer_path": self.model_dir,  # bench_one_batch_server loads the tokenizer from here
            "served_model_name": self.served_model_name,
            "version": self.version,
            "engine": "embedded",
            "startup_time": self.started,
            "tp_size": self.group.spec.tp_size,
            "rank_pids": self.group.pids,
            # graphs on every rank (not on CPU, --disable-cuda-graph, or a failed capture: its reason; then eager)
            "cuda_graph": graphs,
            "cuda_graph_error": next(
                (r["cuda_graph_error"] for r in self.group.ready if r.get("cuda_graph_error")), None
            ),
            "cuda_graph_bs": self.group.ready[0].get("cuda_graph_bs", []) if graphs else [],  # replayed sizes
            "internal_states": [
                {
                    **self.internal_state,
                    # SGLang's internal_state.py: the running batch's cap (one DP rank here), and the KV
                    # room: every running request has its own cache of the context
                    "effective_max_running_requests_per_dp": running,
                    "memory_usage": {"token_capacity": running * self.context},
                }
            ],
        }

    def model_info(self) -> dict:
        """SGLang's /model_info keys that mean something here (http_server.py 812-850)."""
        return {
            "model_path": self.model_dir,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.model_dir,
            "is_generation": True,
            "weight_version": "default",
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        }

    def models(self) -> dict:
        """``GET /v1/models``: the one served model (OpenAI's ModelList, SGLang's ModelCard fields)."""
        card = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "sglang",
            "root": self.served_model_name,
            "parent": None,
            "max_model_len": self.context,
        }
        return {"object": "list", "data": [card]}

    def prometheus(self) -> str:
        return self.metrics.render(self.in_flight, self.internal_state, self.steps if self.speculative else 0)


def engine_version() -> str:
    """This engine's version: the installed package's, plus the commit of the checkout it runs from
    (PEP 440 local part: ``0.1.0+g25468e0a1b2c``, ``.dirty`` with uncommitted changes) -- the code that
    answers, which the package version alone does not name (it has said 0.1.0 since the first commit)."""
    try:
        base = metadata.version("spec-decode-bench")
    except metadata.PackageNotFoundError:
        base = __version__
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty=.dirty", "--abbrev=12", "--exclude=*"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = ""
    return f"{base}+g{described}" if described else base


class _Feed:
    """The token ids a streamed request has committed so far, filled by the thread that runs the
    ranks, read by the HTTP writer at its own pace (cumulative, so skipping states loses nothing).
    A batch's feeds share one condition, so its writer wakes for whichever has news."""

    def __init__(self, cond: threading.Condition) -> None:
        self.ids: list[int] = []
        self.done = False
        self.done_at = 0.0  # perf_counter when the ranks answered
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.cond = cond

    def add(self, new: list[int]) -> None:
        with self.cond:
            self.ids.extend(new)
            self.cond.notify_all()

    def finish(self, result: dict) -> None:
        with self.cond:
            self.result, self.done, self.done_at = result, True, time.perf_counter()
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cond:
            self.error, self.done = error, True
            self.cond.notify_all()

    def due(self, sent: int, interval: int) -> tuple[list[int] | None, bool]:
        """Under ``cond``: (a copy of the ids, finished) when an event is due -- the first token, at
        least ``interval`` unsent tokens (SGLang's stream_interval rule), or the finish -- else (None,
        False)."""
        if self.done:
            return list(self.ids), True
        unsent = len(self.ids) - sent
        if unsent > 0 and (interval == 1 or unsent >= interval or sent == 0):
            return list(self.ids), False
        return None, False


def bind(host: str, port: int) -> ThreadingHTTPServer:
    """Take the port first (before the ranks load for seconds): a taken port fails at once."""
    httpd = ThreadingHTTPServer((host, port), BaseHTTPRequestHandler, bind_and_activate=False)
    httpd.daemon_threads = True
    # listen() backlog: socketserver's default 5 overflowed under 16 clients connecting at once (the
    # connections were reset, issue 28's concurrency 16); uvicorn, SGLang's front, listens with 2048.
    httpd.request_queue_size = 2048
    try:
        httpd.server_bind()
        httpd.server_activate()
    except OSError:
        httpd.server_close()
        raise
    return httpd


def exit_on_rank_death(state: EngineState, grace_s: float = 0.5):
    """The RankGroup's on_death callback: let in-flight requests get their 503, stop the other
    ranks, exit nonzero (from the monitor thread: os._exit, the HTTP loop cannot be joined)."""

    def on_death(err: RankDied) -> None:
        deadline = time.monotonic() + grace_s
        with state.idle:
            while state.in_flight and time.monotonic() < deadline:
                state.idle.wait(timeout=max(0.0, deadline - time.monotonic()))
        state.group.kill()
        log.error("exiting: a rank died (status %d)", EXIT_RANK_DIED)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_RANK_DIED)

    return on_death
