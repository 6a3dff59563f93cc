"""The embedded engine's HTTP server: SGLang 0.5.23's endpoints, fields, log lines and profile lines.

- ``GET /health`` (and ``/health_generate``): 200 once the models are loaded.
- ``GET /server_info`` (and the deprecated ``/get_server_info``): resolved args, version, internal state.
- ``GET|POST /flush_cache``: resets the speculative counters (as SGLang's ``reset_metrics``).
- ``POST /generate``: ``{"text" | "input_ids", "sampling_params": {...}}`` -> ``{"text", "output_ids",
  "meta_info"}`` with SGLang's ``spec_*`` counters when speculation is on. Unknown ``sampling_params``
  keys are refused with HTTP 400 naming the key, like SGLang's msgspec schema.
- Every ``--decode-log-interval`` decode iterations: a ``Decode batch, ...`` line in SGLang's shape.
- With ``SPEC_DECODE_PROFILE=<path>`` in the environment: one JSON line per speculative cycle.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .decoding import Decoder, Generation
from .tokenizer import decode, encode

log = logging.getLogger("spec_decode.embedded")

# SGLang 0.5.23's sampling_params fields (sglang/api/v1/api_types.py). Unknown keys -> 400.
SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "beam_width", "watermark", "choice",
)


class RequestError(ValueError):
    """A bad request: answered with HTTP 400 and this message; the server keeps serving."""


class Counters:
    """Speculative counters since the last /flush_cache, and the decode-log window."""

    def __init__(self) -> None:
        self.reset()
        self.last_log_tic = time.monotonic()  # like SGLang: not reset while idle

    def reset(self) -> None:
        self.total_accept_tokens = 0
        self.total_verify_ct = 0
        self.window_tokens = 0
        self.window_forward_ct = 0
        self.window_correct = 0
        self.last_gen_throughput = 0.0


class EngineState:
    def __init__(self, decoder: Decoder, args: dict, decode_log_interval: int, profile_path: str | None):
        self.decoder = decoder
        self.args = args
        self.interval = max(1, decode_log_interval)
        self.profile_path = profile_path
        self.counters = Counters()
        self.lock = threading.Lock()
        self.started = time.time()
        self.kv_tokens = 0

    # ---- /generate ------------------------------------------------------------------------------
    def parse(self, body: object) -> tuple[list[int], int]:
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise RequestError("sampling_params must be an object (lists of them are not supported)")
        unknown = [k for k in sp if k not in SAMPLING_KEYS]
        if unknown:
            raise RequestError(
                f"unknown field `{unknown[0]}` in sampling_params, expected one of "
                + ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            )
        if float(sp.get("temperature", 1.0) or 0.0) != 0.0:
            raise RequestError(
                "sampling_params.temperature: the embedded engine decodes greedily; send temperature 0"
            )
        n = sp.get("max_new_tokens", 128)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RequestError(f"sampling_params.max_new_tokens must be a positive integer (got {n!r})")
        if "input_ids" in body:
            ids = body["input_ids"]
            if not (isinstance(ids, list) and ids and all(isinstance(i, int) and 0 <= i < 256 for i in ids)):
                raise RequestError("input_ids must be a non-empty list of token ids in 0..255")
        elif isinstance(body.get("text"), str) and body["text"]:
            ids = encode(body["text"])
        else:
            raise RequestError("give `text` (a non-empty string) or `input_ids`")
        room = self.decoder.max_new_tokens(len(ids))
        if n > room:
            raise RequestError(
                f"prompt ({len(ids)} tokens) + sampling_params.max_new_tokens ({n}) exceeds the "
                f"context of {self.decoder.context} tokens (at most {max(room, 0)} new tokens fit)"
            )
        return ids, n

    def generate(self, body: object) -> dict:
        ids, n = self.parse(body)
        with self.lock:
            t0 = time.perf_counter()
            gen = self.decoder.generate(ids, n, on_step=self._on_step)
            latency = time.perf_counter() - t0
            self.kv_tokens = 0
        self._write_profile(gen)
        return self._response(gen, latency)

    def _response(self, gen: Generation, latency: float) -> dict:
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": len(gen.output_ids)},
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": len(gen.output_ids),
            "cached_tokens": 0,
            "e2e_latency": latency,
        }
        if self.decoder.drafter is not None and gen.verify_ct > 0:
            meta.update(
                spec_verify_ct=gen.verify_ct,
                spec_accept_length=len(gen.output_ids) / gen.verify_ct,
                spec_accept_rate=gen.correct_drafts / gen.proposed_drafts,
                spec_num_correct_drafts=gen.correct_drafts,
                spec_num_proposed_drafts=gen.proposed_drafts,
                spec_correct_drafts_histogram=gen.histogram,
            )
        return {"text": decode(gen.output_ids), "output_ids": gen.output_ids, "meta_info": meta}

    def _on_step(self, tokens: int, accepted: int | None) -> None:
        c = self.counters
        c.window_tokens += tokens
        c.window_forward_ct += 1
        self.kv_tokens += tokens
        if accepted is not None:
            c.window_correct += accepted
            c.total_accept_tokens += tokens
            c.total_verify_ct += 1
        if c.window_forward_ct >= self.interval:
            self._log_decode()

    def _log_decode(self) -> None:
        c = self.counters
        now = time.monotonic()
        c.last_gen_throughput = c.window_tokens / max(now - c.last_log_tic, 1e-9)
        parts = ["#running-req: 1", f"#token: {self.kv_tokens}",
                 f"token usage: {self.kv_tokens / self.decoder.context:.2f}"]
        if self.decoder.drafter is not None:
            k = self.decoder.steps
            parts.append(f"accept len: {c.window_tokens / c.window_forward_ct:.2f}")
            parts.append(f"accept rate: {c.window_correct / (c.window_forward_ct * k):.2f}")
        parts += ["cpu graph: False", f"gen throughput (token/s): {c.last_gen_throughput:.2f}",
                  "#queue-req: 0"]
        log.info("Decode batch, " + ", ".join(parts))
        c.window_tokens = c.window_forward_ct = c.window_correct = 0
        c.last_log_tic = now

    def _write_profile(self, gen: Generation) -> None:
        if not self.profile_path or not gen.cycles:
            return
        with open(self.profile_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(c.as_json()) + "\n" for c in gen.cycles)

    # ---- other endpoints ------------------------------------------------------------------------
    def flush(self) -> str:
        with self.lock:
            self.counters.reset()
        return "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"

    def server_info(self) -> dict:
        from spec_decode import __version__

        c = self.counters
        avg = c.total_accept_tokens / c.total_verify_ct if c.total_verify_ct else None
        return {
            **self.args,
            "version": __version__,
            "engine": "embedded",
            "startup_time": self.started,
            "internal_states": [{
                "last_gen_throughput": c.last_gen_throughput,
                # Lifetime since the last /flush_cache, like SGLang's; never a run's number.
                "avg_spec_accept_length": avg,
            }],
        }


def make_handler(state: EngineState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in separate writes: without TCP_NODELAY, Nagle + the client's
        # delayed ACK add ~40 ms to every response.
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):  # keep the server log to engine lines
            pass

        def _send(self, code: int, payload: object) -> None:
            if isinstance(payload, str):
                data, ctype = payload.encode(), "text/plain; charset=utf-8"
            else:
                data, ctype = json.dumps(payload).encode(), "application/json"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> object:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except json.JSONDecodeError as e:
                raise RequestError(f"request body is not valid JSON: {e}") from None

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path in ("/health", "/health_generate", "/ready") and method == "GET":
                    self._send(200, "OK")
                elif path in ("/server_info", "/get_server_info") and method == "GET":
                    self._send(200, state.server_info())
                elif path == "/model_info" and method == "GET":
                    self._send(200, {"model_path": state.args["model_path"], "is_generation": True,
                                     "architectures": ["LlamaForCausalLM"]})
                elif path == "/flush_cache":
                    self._body()
                    self._send(200, state.flush())
                elif path == "/generate" and method == "POST":
                    self._send(200, state.generate(self._body()))
                else:
                    self._send(404, {"error": f"no route {method} {path}"})
            except RequestError as e:
                self._send(400, {"error": {"message": str(e), "code": 400}})
            except Exception as e:  # noqa: BLE001 - a failed request must not kill the server
                log.exception("request failed")
                self._send(500, {"error": {"message": f"{type(e).__name__}: {e}", "code": 500}})

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

    return Handler


def serve(state: EngineState, host: str, port: int) -> None:
    httpd = ThreadingHTTPServer((host, port), make_handler(state))
    httpd.daemon_threads = True
    log.info("The server is fired up and ready to roll! (http://%s:%d, pid %d)", host, port, os.getpid())
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
