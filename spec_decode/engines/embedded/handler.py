"""The embedded server's HTTP handler: SGLang 0.5.23's routes (404 for an unknown path, 405 with an Allow
header for a known one with another method), the body limits (Content-Length required, 1 MiB at most),
JSON, text and server-sent-event responses, status codes; what each route does is server.EngineState's
(and openai_api's for ``/v1/*``).

Keep-alive: every answer -- a 404 and a 405 too -- comes after the request's body is read, so the
next request on the connection starts where this one ended; a body that cannot be read to its end
(no or a bad length, too long, cut off) closes the connection after the answer.

``serve`` runs the bound socket with this handler (the front's loop)."""

from __future__ import annotations

import json
import logging
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from spec_decode.engines.embedded import openai_api
from spec_decode.engines.embedded.ranks import RankDied, RidInFlight
from spec_decode.engines.embedded.request import GenerateBatch, RequestError

if TYPE_CHECKING:
    from spec_decode.engines.embedded.server import EngineState

log = logging.getLogger("spec_decode.embedded")

MAX_BODY_BYTES = 1 << 20  # a prompt is at most the context (1024 bytes); anything far larger is abuse


# path -> allowed methods (anything else on a known path: 405 with an Allow header)
ROUTES = {
    "/health": ("GET",),
    "/health_generate": ("GET",),
    "/ready": ("GET",),
    "/server_info": ("GET",),
    "/get_server_info": ("GET",),
    "/model_info": ("GET",),
    "/get_model_info": ("GET",),
    "/flush_cache": ("GET", "POST"),
    "/generate": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/chat/completions": ("POST",),
    "/v1/models": ("GET",),
    "/metrics": ("GET",),
}
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HttpError(Exception):
    def __init__(self, code: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.code, self.headers = code, headers or {}


def make_handler(state: EngineState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A request line too broken to carry a version is answered in HTTP/1.0 (a status line the
        # client can read), not http.server's HTTP/0.9 default (a bare HTML body).
        default_request_version = "HTTP/1.0"
        # Headers and body leave in separate writes: without TCP_NODELAY, Nagle + the client's
        # delayed ACK add ~40 ms to every response.
        disable_nagle_algorithm = True
        # A client that announces more body than it sends, or goes silent mid-request, gets 408
        # instead of holding a thread forever.
        timeout = 30

        def log_message(self, fmt, *args):  # keep the server log to engine lines
            pass

        def _send(self, code: int, payload: object, headers: dict | None = None, ctype: str | None = None) -> None:
            if isinstance(payload, str):
                data, ctype = payload.encode(), ctype or "text/plain; charset=utf-8"
            else:
                data, ctype = json.dumps(payload).encode(), "application/json"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _stream(self, start) -> None:
            """SSE over chunked transfer encoding (one HTTP chunk per event, one write each). ``start()``
            submits the request and returns its events: called before the 200, so that a rid in flight
            is a 400 and a dead rank a 503 as without streaming."""
            if state.group.dead is not None:
                raise RankDied(str(state.group.dead))
            events = start()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

            try:
                for out in events:
                    event(b"data: " + json.dumps(out).encode() + b"\n\n")
            except (BrokenPipeError, ConnectionResetError):
                raise
            except Exception as e:  # noqa: BLE001 - the 200 is out: the error travels as an event
                code = 503 if isinstance(e, RankDied) else 500
                if code == 500:
                    log.exception("streamed request failed")
                message = f"the server is shutting down: {e}" if code == 503 else f"{type(e).__name__}: {e}"
                event(b"data: " + json.dumps({"error": {"message": message, "code": code}}).encode() + b"\n\n")
            event(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _generate(self, batch: GenerateBatch) -> None:
            if batch.stream:
                self._stream(lambda: state.stream_batch(batch) if batch.batched else state.stream(batch.reqs[0]))
            elif batch.batched:
                self._send(200, state.generate_batch(batch))
            else:
                self._send(200, state.generate(batch.reqs[0]))

        def _openai(self, path: str, body: object) -> None:
            parse = openai_api.parse_completion if path == "/v1/completions" else openai_api.parse_chat
            req = parse(body, state.context, state.steps, state.served_model_name)
            batch = req.batch
            if batch.stream:
                self._stream(lambda: openai_api.chunks(req, state.stream_batch(batch)))
            else:
                self._send(200, openai_api.response(req, state.generate_batch(batch)))

        def _body(self) -> object:
            raw = self._raw_body()
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too deep
                raise RequestError(f"request body is not valid JSON: {str(e)[:200]}") from None

        def _raw_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise HttpError(411, "Transfer-Encoding is not supported; send a Content-Length")
            raw_length = self.headers.get("Content-Length") or "0"
            try:
                length = int(raw_length)
                if length < 0:
                    raise ValueError
            except ValueError:
                self.close_connection = True  # we cannot know where the body ends
                raise HttpError(
                    400, f"Content-Length must be a non-negative integer (got {raw_length!r:.40})"
                ) from None
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                self.close_connection = True
                raise HttpError(
                    408, f"request body: {length} bytes announced, not received within {self.timeout}s"
                ) from None
            if len(raw) < length:
                self.close_connection = True
                raise HttpError(400, f"request body ended after {len(raw)} of {length} bytes")
            return raw

        def _skip_body(self) -> None:
            """Read a body we will not use (before a 404 or 405): the connection stays in step; one
            that cannot be read to its end is closed after the answer (``_raw_body`` marks it)."""
            try:
                self._raw_body()
            except HttpError:
                pass

        def _route(self) -> None:
            method = self.command
            path, _, query = self.path.partition("?")
            openai = path.startswith("/v1/")
            try:
                if path not in ROUTES:
                    self._skip_body()
                    raise HttpError(404, f"no route {method} {path[:200]}")
                if method not in ROUTES[path]:
                    self._skip_body()
                    raise HttpError(
                        405,
                        f"method {method} is not allowed on {path}; use {' or '.join(ROUTES[path])}",
                        {"Allow": ", ".join(ROUTES[path])},
                    )
                body = self._body()  # always read it, so the connection stays in step
                if path in ("/health", "/health_generate", "/ready"):
                    if state.group.dead is not None:
                        raise HttpError(503, str(state.group.dead))
                    self._send(200, "OK")
                elif path in ("/server_info", "/get_server_info"):
                    self._send(200, state.server_info())
                elif path in ("/model_info", "/get_model_info"):
                    self._send(200, state.model_info())
                elif path == "/v1/models":
                    self._send(200, state.models())
                elif path == "/metrics":
                    self._send(200, state.prometheus(), ctype=PROMETHEUS_TYPE)
                elif path == "/flush_cache":
                    self._send(200, state.flush(parse_qs(query)))
                else:
                    with state.idle:
                        state.in_flight += 1
                    try:
                        if path == "/generate":
                            self._generate(state.parse(body))
                        else:
                            self._openai(path, body)
                    finally:
                        with state.idle:
                            state.in_flight -= 1
                            state.idle.notify_all()
            except (RequestError, RidInFlight) as e:
                self._error(400, str(e), openai)
            except HttpError as e:
                self._error(e.code, str(e), openai and e.code not in (404, 405), e.headers)
            except RankDied as e:
                self._error(503, f"the server is shutting down: {e}", openai)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client left before its answer: nobody to tell
            except Exception as e:  # noqa: BLE001 - a failed request must not kill the server
                log.exception("request failed")
                self._error(500, f"{type(e).__name__}: {e}", openai)

        def _error(self, code: int, message: str, openai: bool, headers: dict | None = None) -> None:
            """SGLang's error bodies: ``{"error": {...}}``, and on the OpenAI routes their ErrorResponse."""
            if openai:
                kind = (
                    "BadRequestError"
                    if code < 500
                    else {503: "ServiceUnavailableError"}.get(code, "InternalServerError")
                )
                payload = {"object": "error", "message": message, "type": kind, "param": None, "code": code}
            else:
                payload = {"error": {"message": message, "code": code}}
            self._send(code, payload, headers)

        def __getattr__(self, name: str):
            # Every method (PUT, FOO, lower-case get...) reaches _route: 404 or 405, never http.server's 501.
            if name.startswith("do_"):
                return self._route
            raise AttributeError(name)

    return Handler


def serve(httpd: ThreadingHTTPServer, state: EngineState) -> None:
    httpd.RequestHandlerClass = make_handler(state)
    host, port = httpd.server_address[:2]
    log.info(
        "The server is fired up and ready to roll! (http://%s:%d, pid %d, tp_size %d, rank pids %s)",
        host,
        port,
        os.getpid(),
        state.group.spec.tp_size,
        state.group.pids,
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
