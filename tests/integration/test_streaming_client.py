"""The streaming client over real HTTP: tests/sse_server.py (a scripted SSE server process, SGLang
0.5.23's wire format) for the parser and the timing rules; the request bodies it receives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spec_decode.runner.client import Client, ClientError

from ..conftest import ROOT

pytestmark = pytest.mark.integration

SPEC_META = {
    "spec_verify_ct": 4,
    "spec_num_correct_drafts": 9,
    "spec_num_proposed_drafts": 12,
    "spec_correct_drafts_histogram": [0, 1, 1, 2],
    "e2e_latency": 0.2,
}


def serve(tmp_path: Path, **plan) -> tuple[subprocess.Popen, Client]:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "sse_server.py"), str(path)], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    assert line.startswith("port "), line
    return proc, Client(f"http://127.0.0.1:{int(line.split()[1])}", timeout_s=10)


@pytest.fixture
def server(tmp_path):
    procs = []

    def start(**plan):
        proc, client = serve(tmp_path, **plan)
        procs.append(proc)
        return client

    yield start
    for p in procs:
        p.terminate()
        p.wait(5)


BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}}


@pytest.mark.parametrize(
    "ids,framing", [("cumulative", "chunked"), ("incremental", "chunked"), ("cumulative", "close")]
)
def test_stream_spreads_each_chunks_gap_over_its_tokens(server, ids, framing):
    # prefill token after 100 ms, then verify cycles of 4, 1, 3 tokens 80, 40, 120 ms apart
    client = server(chunks=[[100, 1], [80, 4], [40, 1], [120, 3]], ids=ids, framing=framing, meta=SPEC_META)
    r = client.generate(BODY, 0, 0, stream=True)
    assert r.stream and r.completion_tokens == 9
    assert r.output_ids == [100 + i for i in range(9)]
    assert 0.095 <= r.ttft_s < 0.2
    gaps = r.token_gaps_s
    assert len(gaps) == 8  # one per token after the first
    # each chunk's gap spread over its tokens: 4 x 20 ms, 1 x 40 ms, 3 x 40 ms (scheduling noise: +15 ms;
    # the server sleeps between chunks, so a chunk read late shortens the next one's gap by as much: -10 ms,
    # seen -2.7 ms in a fresh clone; a gap not spread would put 0 on a chunk's later tokens)
    want = [0.020] * 4 + [0.040] + [0.040] * 3
    for g, w in zip(gaps, want):
        assert w - 0.010 <= g <= w + 0.015, (gaps, want)
    assert gaps[0] == gaps[3] and gaps[5] == gaps[7]  # one chunk's tokens share its gap equally
    # the final chunk's counters; throughput is completion tokens over the whole stream's wall time
    assert (r.spec_verify_ct, r.spec_num_correct_drafts, r.spec_correct_drafts_histogram) == (4, 9, [0, 1, 1, 2])
    assert r.wall_s >= 0.34 and r.throughput_tok_s == pytest.approx(9 / r.wall_s)
    assert r.wall_s >= r.ttft_s + sum(gaps) - 1e-6


def test_first_chunk_with_several_tokens_adds_zero_gaps(server):
    client = server(chunks=[[50, 3], [30, 2]])
    r = client.generate(BODY, 0, 0, stream=True)
    assert r.token_gaps_s[:2] == [0.0, 0.0] and len(r.token_gaps_s) == 4
    assert 0.012 <= r.token_gaps_s[2] == r.token_gaps_s[3] <= 0.03


def test_non_stream_unchanged_and_carries_ids_and_histogram(server):
    client = server(chunks=[[0, 5]], meta=SPEC_META)
    r = client.generate(BODY, 0, 0)
    assert not r.stream and r.ttft_s is None and r.token_gaps_s is None
    assert r.completion_tokens == 5 and r.output_ids == [100, 101, 102, 103, 104]
    assert r.spec_correct_drafts_histogram == [0, 1, 1, 2]


def test_stream_request_body_and_ignore_eos_reach_the_server(server, tmp_path):
    bodies = tmp_path / "bodies.jsonl"
    client = server(chunks=[[0, 2]], bodies=str(bodies))
    client.generate(client.generate_body("hi", 2, 0.0, ignore_eos=False), 0, 0, stream=True)
    client.generate(client.generate_body("hi", 2, 0.0, ignore_eos=True), 0, 0)
    sent = [json.loads(x) for x in bodies.read_text().splitlines()]
    assert sent[0]["stream"] is True and sent[0]["sampling_params"]["ignore_eos"] is False
    assert "stream" not in sent[1] and sent[1]["sampling_params"]["ignore_eos"] is True


def test_stream_failures_are_client_errors_naming_the_cause(server):
    with pytest.raises(ClientError, match="stream error from the server.*injected failure"):
        server(chunks=[[0, 1], [0, 2], [0, 2]], error_after=1).generate(BODY, 0, 0, stream=True)
    with pytest.raises(ClientError, match=r"without `data: \[DONE\]`"):
        server(chunks=[[0, 1], [0, 2]], no_done=True).generate(BODY, 0, 0, stream=True)
    with pytest.raises(ClientError, match="not text/event-stream"):
        server(chunks=[[0, 1]], content_type="application/json").generate(BODY, 0, 0, stream=True)
    stalled = server(chunks=[[0, 1], [3000, 1]])
    stalled.timeout_s = 1.0  # a server that stops sending mid-stream: the per-read timeout
    with pytest.raises(ClientError, match=r"no data within 1s \(engine.request_timeout_s\)"):
        stalled.generate(BODY, 0, 0, stream=True)


def test_unmatched_ids_are_dropped_not_guessed(server):
    # ids that are neither cumulative nor incremental (here: the server's "none" leaves them out)
    r = server(chunks=[[0, 1], [0, 3]], ids="none").generate(BODY, 0, 0, stream=True)
    assert r.completion_tokens == 4 and r.output_ids is None
