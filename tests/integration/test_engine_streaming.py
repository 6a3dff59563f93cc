"""Streaming (`"stream": true` on /generate) from the embedded engine, as SGLang 0.5.23 serves it:
real server processes over real HTTP, and the front's stream driver against real rank processes."""

import json
import time

import pytest
import requests

from ..conftest import DRAFTER, TARGET
from .engine_args import embedded_server, spec_flags

pytestmark = pytest.mark.integration
STEPS = 3
SPEC = spec_flags(STEPS)
N = 96
BODY = {
    "text": "The old robot sleeps in the garden. ",
    "sampling_params": {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
}
SPEC_KEYS = {
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
}


def read_events(resp: requests.Response) -> list:
    """The SSE events of a response, checking the framing: `data: ...` lines separated by blank
    lines, the last one `[DONE]`. Returns the parsed JSON events (without [DONE])."""
    raw = resp.content.decode()
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    events = []
    for block in blocks[:-2]:
        assert block.startswith("data: ") and "\n" not in block, block[:200]
        events.append(json.loads(block[len("data: ") :]))
    return events


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream_server")
    with embedded_server(d / "server.log", *SPEC, "--random-seed", "0") as srv:
        yield srv


def test_stream_events_are_cumulative_one_per_cycle_and_the_last_carries_the_counters(spec_server):
    url = spec_server.base_url + "/generate"
    plain = requests.post(url, json=BODY, timeout=60).json()
    r = requests.post(url, json={**BODY, "stream": True}, timeout=60)
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = read_events(r)
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    steps = [b - a for a, b in zip([0, *counts], counts)]
    assert all(s >= 1 for s in steps), counts  # every event brings new tokens
    assert sum(steps) == counts[-1] == N  # the contract's rule: new tokens = increase of completion_tokens
    for e in events:  # cumulative, SGLang's default (no --incremental-streaming-output)
        assert len(e["output_ids"]) == e["meta_info"]["completion_tokens"]
        assert e["output_ids"] == plain["output_ids"][: len(e["output_ids"])]
        assert e["meta_info"]["id"] == events[0]["meta_info"]["id"]
    *middle, last = events
    # The prefill's token is its own event when the writer keeps up; a writer behind on a loaded
    # host sends the newest state instead (SGLang's coalescing), so only >= 1 is certain.
    assert steps[0] >= 1
    for e in middle:
        assert e["meta_info"]["finish_reason"] is None and not SPEC_KEYS & set(e["meta_info"])
    meta = last["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": N}
    assert SPEC_KEYS <= set(meta) and isinstance(meta["e2e_latency"], float)
    assert last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    for key in SPEC_KEYS - {"spec_accept_length", "spec_accept_rate"}:
        assert meta[key] == plain["meta_info"][key], key  # greedy: the same cycles as non-stream
    # The prefill's event + one per verify cycle, the last cycle in the finish. A writer that falls
    # behind (a loaded host) sends the newest state, several cycles in one event, as SGLang does:
    # never more events than that, and on a host that keeps up, most cycles get their own.
    cycles = meta["spec_verify_ct"]
    assert (1 + cycles) // 2 <= len(events) <= 1 + cycles, (len(events), cycles)


def test_non_stream_response_is_unchanged_and_carries_the_histogram(spec_server):
    out = requests.post(spec_server.base_url + "/generate", json=BODY, timeout=60)
    assert out.headers["Content-Type"] == "application/json"
    body = out.json()
    meta = body["meta_info"]
    assert set(body) == {"text", "output_ids", "meta_info"} and len(body["output_ids"]) == N
    hist = meta["spec_correct_drafts_histogram"]
    assert len(hist) == STEPS + 1 and sum(hist) == meta["spec_verify_ct"]
    assert sum(a * n for a, n in enumerate(hist)) == meta["spec_num_correct_drafts"]


def test_stream_interval_batches_tokens_like_sglang(spec_server):
    body = {**BODY, "stream": True, "sampling_params": {**BODY["sampling_params"], "stream_interval": 20}}
    events = read_events(requests.post(spec_server.base_url + "/generate", json=body, timeout=60))
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts[0] >= 1 and counts[-1] == N  # the first event: whatever is there (1 token if prompt)
    # SGLang's rule: the first token at once, then an event once >= 20 tokens are unsent.
    assert all(b - a >= 20 for a, b in zip(counts[1:-1], counts[2:-1])), counts
    assert counts[1] - counts[0] >= 20 and len(events) <= 2 + N // 20


def test_stream_false_and_bad_stream_values(spec_server):
    url = spec_server.base_url + "/generate"
    assert requests.post(url, json={**BODY, "stream": False}, timeout=60).json()["meta_info"]["completion_tokens"] == N
    r = requests.post(url, json={**BODY, "stream": "yes"}, timeout=10)
    assert r.status_code == 400 and "stream must be a boolean" in r.json()["error"]["message"]


def test_a_slow_reader_does_not_slow_the_decode_loop():
    """The front's stream driver against real rank processes: a consumer that stops reading after
    the first event for longer than the whole generation takes must find the generation finished
    meanwhile (e2e_latency well under the pause) and get the rest coalesced into the final state."""
    from spec_decode.engines.embedded.ranks import RankGroup
    from spec_decode.engines.embedded.request import GenerateRequest
    from spec_decode.engines.embedded.scheduler import RankSpec
    from spec_decode.engines.embedded.server import EngineState

    spec = RankSpec(
        model_path=str(TARGET),
        draft_model_path=str(DRAFTER),
        steps=STEPS,
        tp_size=1,
        device="cpu",
        cpu_threads=1,
        random_seed=0,
        decode_log_interval=40,
        log_level="warning",
        dist_port=0,
        front_pid=0,
    )
    group = RankGroup(spec)
    try:
        state = EngineState(group, {}, 1024, STEPS, speculative=True)
        req = GenerateRequest(list(b"The old robot sleeps in the garden. "), 300, stream=True)
        t0 = time.perf_counter()
        list(state.stream(req))  # the unhindered time of this request
        unhindered_s = time.perf_counter() - t0
        # a decode loop held by the reader ends past the pause; the margin (6x) is for a loaded machine, where
        # the paused generation itself took 2.3x its unhindered time (1.11 s vs 0.49 s, load 5)
        pause_s = max(4.0, 6 * unhindered_s)
        events = state.stream(req)
        first = next(events)
        time.sleep(pause_s)  # the HTTP writer blocked on a client that does not read
        rest = list(events)
    finally:
        group.close()
    assert first["meta_info"]["completion_tokens"] < 300  # 1 when this thread wakes at once
    final = rest[-1]["meta_info"]
    assert final["completion_tokens"] == 300 and final["finish_reason"] is not None
    assert final["e2e_latency"] < pause_s / 2, (final["e2e_latency"], pause_s, unhindered_s)
    assert len(rest) <= 2, [e["meta_info"]["completion_tokens"] for e in rest]  # coalesced, nothing lost
