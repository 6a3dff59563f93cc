"""The embedded engine speaks what SGLang 0.5.23 speaks to its users, over raw HTTP: keep-alive. One server
for the module (a real process, real HTTP)."""

from __future__ import annotations

import http.client
import json

import pytest

from .engine_args import embedded_server, spec_flags

pytestmark = pytest.mark.integration
STEPS = 3
PROMPT = "The old robot sleeps in the garden. "
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("clients")
    with embedded_server(d / "server.log", *spec_flags(STEPS), startup_timeout_s=60) as srv:
        yield srv


# ---- keep-alive ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,path,status", [("POST", "/no_such_route", 404), ("PUT", "/generate", 405)])
def test_an_error_before_the_body_leaves_the_keep_alive_connection_in_step(server, method, path, status):
    """A 404/405 on a request with a body, then a valid request on the same connection: the second is
    answered as itself (the front read the first body before answering; before, its bytes were taken
    for the next request line: 400 "Bad request syntax")."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = json.dumps({"text": PROMPT, "sampling_params": {"max_new_tokens": 4, **GREEDY}})
    headers = {"Content-Type": "application/json"}
    conn.request(method, path, body=body, headers=headers)
    first = conn.getresponse()
    first.read()
    assert first.status == status
    sock = conn.sock
    assert sock is not None and not first.will_close  # the server keeps the connection
    conn.request("POST", "/generate", body=body, headers=headers)
    second = conn.getresponse()
    answer = second.read()
    assert second.status == 200, answer[:300]
    assert conn.sock is sock, "the client had to reconnect"
    assert json.loads(answer)["meta_info"]["completion_tokens"] == 4
    conn.close()
