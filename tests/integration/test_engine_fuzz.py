"""The embedded engine's HTTP front under bad input: a seeded fuzzer against a real server process.

Generated cases (seeded, bounded in count and time, loopback only):
- JSON bodies: a valid /generate body with one field replaced by a value of another type or range
  (every top-level and sampling_params field, unknown keys, token ids), a field deleted, or the whole
  body replaced;
- raw requests: broken JSON, invalid UTF-8, deep nesting, bad or missing Content-Length, chunked
  bodies, truncated bodies, and every method on known and unknown paths.

Every answer must be a 4xx naming the field (404 unknown path, 405 wrong method) or a 200 of the
right length -- never a 5xx, a hang or a dropped connection -- and a valid request decodes exactly
as before, between the cases and after them.
"""

from __future__ import annotations

import json
import random
import socket
import time

import pytest
import requests

from spec_decode.engines.embedded.request import SAMPLING_KEYS

from .engine_args import embedded_server, spec_flags

pytestmark = pytest.mark.integration
SEED = 20261129
CASES = 300
BUDGET_S = 120.0
N = 6  # new tokens per valid request: the fuzzer is about the front, not decoding speed
PROMPT = "The old robot sleeps in the garden. "
VALID = {"text": PROMPT, "sampling_params": {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}}
TOP_KEYS = (
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "rid",
    "return_logprob",
    "return_hidden_states",
    "no_such_field",
)
PATHS = (
    "/generate",
    "/health",
    "/health_generate",
    "/ready",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/flush_cache",
    "/",
    "/generate/",
    "//generate",
    "/v1/completions",
    "/%00",
    "/generate?x=1",
    "/flush_cache?timeout=abc",
    "/flush_cache?timeout=-1",
)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "get", "FOO")
# SGLang's routes and their methods (http_server.py)
ROUTE_METHODS = {
    "/generate": {"POST"},
    "/flush_cache": {"GET", "POST"},
    "/health": {"GET"},
    "/health_generate": {"GET"},
    "/ready": {"GET"},
    "/server_info": {"GET"},
    "/get_server_info": {"GET"},
    "/model_info": {"GET"},
    "/get_model_info": {"GET"},
    "/metrics": {"GET"},
    "/v1/models": {"GET"},
    "/v1/completions": {"POST"},
    "/v1/chat/completions": {"POST"},
}
NEED_A_BODY = ("/generate", "/v1/completions", "/v1/chat/completions")


def expected_status(method: str, target: str) -> int:
    """What a bodiless request must get: 404 unknown path, 405 wrong method, else 200 or 400."""
    path, _, query = target.partition("?")
    path = "/" + path.lstrip("/")  # http.server collapses a leading "//" (open-redirect guard)
    if path not in ROUTE_METHODS:
        return 404
    if method not in ROUTE_METHODS[path]:
        return 405
    if path in NEED_A_BODY or "timeout=abc" in query or "timeout=-1" in query:
        return 400  # no prompt; a timeout that is not a number >= 0
    return 200


def values(rnd: random.Random):
    """A JSON value of any type, biased to edge cases."""
    pool = [
        None,
        True,
        False,
        0,
        1,
        -1,
        3,
        255,
        256,
        2**31,
        2**63,
        -(2**63) - 1,
        10**30,
        0.0,
        -0.0,
        0.5,
        1.5,
        -1e308,
        1e308,
        float("nan"),
        float("inf"),
        "",
        "x",
        "0",
        "null",
        "true",
        "ü\u0000",
        "a" * 2000,
        [],
        [1],
        [1, 2, "a"],
        [[1, 2]],
        [None],
        [0.5],
        {},
        {"a": 1},
        {"enabled": True},
        {"x": {"y": [1, {"z": None}]}},
        ["stop"],
        [256],
        [True],
    ]
    return rnd.choice(pool)


def mutate(rnd: random.Random) -> tuple[object, str | None]:
    """(body, the field it changed -- what a 400 must name -- or None)."""
    body = json.loads(json.dumps(VALID))
    kind = rnd.random()
    if kind < 0.5:
        key = rnd.choice([*SAMPLING_KEYS, "max_tokens", "seed", ""])
        if rnd.random() < 0.15:
            body["sampling_params"].pop(key, None)
        else:
            body["sampling_params"][key] = values(rnd)
        return body, key or "sampling_params"
    if kind < 0.8:
        key = rnd.choice(TOP_KEYS)
        if rnd.random() < 0.15:
            body.pop(key, None)
        else:
            body[key] = values(rnd)
        return body, key
    if kind < 0.92:
        ids = list(PROMPT.encode())
        ids[rnd.randrange(len(ids))] = values(rnd)
        body.pop("text")
        body["input_ids"] = ids
        return body, "input_ids"
    return values(rnd), "body"


def raw_request(port: int, data: bytes, shut_write: bool = False, timeout_s: float = 40) -> tuple[int, bytes]:
    """Send raw bytes; return (status, body). Any failure to get a full answer fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        if shut_write:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"connection dropped without an answer to {data[:80]!r}"
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
        length = int(headers.get(b"Content-Length", b"0"))
        if data.split(b" ", 1)[0] == b"HEAD":
            return status, b""
        while len(rest) < length:
            chunk = s.recv(65536)
            assert chunk, f"connection dropped mid-answer to {data[:80]!r}"
            rest += chunk
        return status, rest[:length]


def raw_cases(rnd: random.Random, n: int) -> list[tuple[bytes, bool, set[int]]]:
    """(request bytes, shut the write side after sending, acceptable statuses)."""

    def post(body: bytes, headers: str | None = None) -> bytes:
        h = headers if headers is not None else f"Content-Length: {len(body)}\r\n"
        return b"POST /generate HTTP/1.1\r\nHost: x\r\n" + h.encode() + b"Connection: close\r\n\r\n" + body

    good = json.dumps(VALID).encode()
    cases = [
        (post(good[: len(good) // 2]), False, {400}),
        (post(b'{"text": "\xff\xfe\xfd", "sampling_params": {"temperature": 0}}'), False, {400}),
        (post(b"[" * 100_000), False, {400}),
        (post(b'{"text": ' * 50_000), False, {400}),
        (post(good, "Content-Length: abc\r\n"), False, {400}),
        (post(good, "Content-Length: -5\r\n"), False, {400}),
        (post(good, "Content-Length: 1000000000\r\n"), False, {413}),
        (post(good, "Transfer-Encoding: chunked\r\n"), False, {411}),
        (post(good[:10], f"Content-Length: {len(good)}\r\n"), True, {400}),
        (b"GARBAGE\r\n\r\n", False, {400}),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", False, {414, 400}),
    ]
    for _ in range(n):
        cases.append((post(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))), False, {400}))
    for method in METHODS:
        for path in PATHS:
            req = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            cases.append((req.encode(), False, {expected_status(method, path)}))
    rnd.shuffle(cases)
    return cases


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    with embedded_server(d / "server.log", *spec_flags(2)) as srv:
        yield srv, d


def final_answer(r: requests.Response) -> dict:
    """The answer of a 200: the JSON body, or for `"stream": true` the last SSE event before [DONE]. A
    mutation can make a batch of one (`text` a list of one string): its answer is a list of one."""
    if r.headers["Content-Type"] != "text/event-stream":
        out = r.json()
        if isinstance(out, list):
            assert len(out) == 1, r.text[:300]
            return out[0]
        return out
    blocks = r.text.split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""], r.text[-300:]
    last = json.loads(blocks[-3].removeprefix("data: "))
    assert last["meta_info"]["finish_reason"] is not None, last
    return last


def canary(srv, session, want: list[int]) -> None:
    r = session.post(srv.base_url + "/generate", json=VALID, timeout=30)
    assert r.status_code == 200 and r.json()["output_ids"] == want, r.text[:300]


def test_generated_bad_bodies_get_4xx_naming_the_field(server):
    srv, d = server
    session = requests.Session()
    want = session.post(srv.base_url + "/generate", json=VALID, timeout=30).json()["output_ids"]
    assert len(want) == N
    rnd = random.Random(SEED)
    t0, seen = time.monotonic(), {200: 0, 400: 0}
    for i in range(CASES):
        assert time.monotonic() - t0 < BUDGET_S, f"fuzzing took over {BUDGET_S}s at case {i}"
        body, field = mutate(rnd)
        data = json.dumps(body)  # NaN/Infinity as Python's json writes them (SGLang's parser too)
        r = session.post(
            srv.base_url + "/generate", data=data, timeout=40, headers={"Content-Type": "application/json"}
        )
        assert r.status_code in (200, 400), f"case {i}: {data[:200]} -> {r.status_code} {r.text[:300]}"
        seen[r.status_code] += 1
        if r.status_code == 400:
            message = r.json()["error"]["message"]
            assert field in message or field == "body", f"case {i}: {data[:200]} -> {message!r} names no `{field}`"
        else:
            out = final_answer(r)
            asked = body["sampling_params"].get("max_new_tokens", 128) if isinstance(body, dict) else None
            if isinstance(asked, int):
                assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) == asked
            if body.get("text") == PROMPT and "input_ids" not in body and isinstance(asked, int):
                k = min(asked, N)  # greedy: a longer or shorter answer shares the prefix
                assert out["output_ids"][:k] == want[:k], f"case {i}: {data[:200]}"
        if i % 25 == 0:
            canary(srv, session, want)
    canary(srv, session, want)
    assert seen[200] > 10 and seen[400] > 100, seen  # the generator reaches both sides
    assert "Traceback" not in (d / "server.log").read_text()


def test_raw_malformed_requests_and_methods_get_4xx(server):
    srv, d = server
    rnd = random.Random(SEED + 1)
    cases = raw_cases(rnd, 40)
    t0 = time.monotonic()
    for data, shut, ok in cases:
        assert time.monotonic() - t0 < BUDGET_S
        status, payload = raw_request(srv.port, data, shut)
        assert status in ok, f"{data[:100]!r} -> {status} (want {ok}) {payload[:200]!r}"
        if status == 405 and not data.startswith(b"HEAD"):
            assert b"not allowed" in payload
    want = requests.post(srv.base_url + "/generate", json=VALID, timeout=30).json()["output_ids"]
    canary(srv, requests.Session(), want)
    assert "Traceback" not in (d / "server.log").read_text()
