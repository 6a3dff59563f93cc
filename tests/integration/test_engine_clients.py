"""The embedded engine speaks what SGLang 0.5.23 speaks to its users, tried with their own clients: SGLang's
``bench_serving`` (``--backend sglang`` and ``sglang-oai``), ``bench_one_batch_server`` and
``test.send_one`` (run by tests/sglang_client.py from the sglang package the contract tier installs),
the ``openai`` client, and raw HTTP for the OpenAI routes, batches, ``/metrics``, the info routes and
keep-alive. One server for the module (a real process, real HTTP); no network (HF_HUB_OFFLINE)."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from ..conftest import PROMPTS, ROOT, TARGET
from .engine_args import embedded_server, spec_flags

pytestmark = pytest.mark.integration
STEPS = 3
SERVED = os.path.relpath(TARGET)  # the model's name, as given (SGLang's served_model_name)
PROMPT = "The old robot sleeps in the garden. "
GREEDY = {"temperature": 0, "ignore_eos": True}
# tokenizer_manager.py 2507-2557 and 2753 (0.5.23), in its order; then the spec_* counters
META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
]
SPEC_KEYS = [
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
]


def need(module: str) -> None:
    """A client the CI installs (.ci/install-sglang-contract.sh): absent there is a failure, here a skip."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI") == "true" and os.environ.get("SPEC_DECODE_SKIP_CONTRACT") != "1":
            pytest.fail(f"{module} is not installed: CI runs .ci/install-sglang-contract.sh")
        pytest.skip(f"{module} is not installed (.ci/install-sglang-contract.sh)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Served as users start it, with a relative --model-path (the last one given wins)."""
    d = tmp_path_factory.mktemp("clients")
    with embedded_server(d / "server.log", *spec_flags(STEPS), "--model-path", SERVED, startup_timeout_s=60) as srv:
        yield srv


def generate(srv, body: dict, **kw) -> requests.Response:
    return requests.post(srv.base_url + "/generate", json=body, timeout=60, **kw)


def one(srv, text: str, n: int) -> dict:
    r = generate(srv, {"text": text, "sampling_params": {"max_new_tokens": n, **GREEDY}})
    assert r.status_code == 200, r.text[:300]
    return r.json()


def sse(r: requests.Response) -> list[dict]:
    """The events of a streamed answer, checked to end with [DONE]."""
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream", r.text[:300]
    blocks = [b for b in r.text.split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]", blocks[-3:]
    return [json.loads(b.removeprefix("data: ")) for b in blocks[:-1]]


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


# ---- /generate as SGLang answers it ------------------------------------------------------------------
def test_meta_info_keys_are_sglangs_in_its_order(server):
    meta = one(server, PROMPT, 16)["meta_info"]
    assert list(meta) == [*META_KEYS, "e2e_latency", *SPEC_KEYS]
    assert meta["weight_version"] == "default" and meta["num_retractions"] == meta["reasoning_tokens"] == 0
    events = sse(
        generate(server, {"text": PROMPT, "sampling_params": {"max_new_tokens": 16, **GREEDY}, "stream": True})
    )
    assert all(list(e["meta_info"]) == META_KEYS for e in events[:-1])  # a stream's states: no e2e_latency yet
    assert list(events[-1]["meta_info"]) == [*META_KEYS, "e2e_latency", *SPEC_KEYS]


@pytest.mark.parametrize("field", ["text", "input_ids"])
def test_a_batch_is_answered_as_a_list_in_order_and_decodes_as_its_prompts_alone(server, field):
    texts = [PROMPT, "The tired river listened under the bridge. "]
    alone = [one(server, t, 24) for t in texts]
    prompts = texts if field == "text" else [list(t.encode()) for t in texts]
    for batch in (prompts[:1], prompts):  # a list of one is a batch too (SGLang answers a list)
        r = generate(server, {field: batch, "sampling_params": {"max_new_tokens": 24, **GREEDY}})
        assert r.status_code == 200, r.text[:300]
        outs = r.json()
        assert isinstance(outs, list) and len(outs) == len(batch)
        assert [o["output_ids"] for o in outs] == [a["output_ids"] for a in alone[: len(batch)]]
        assert len({o["meta_info"]["id"] for o in outs}) == len(batch)
    # one sampling_params per prompt, and rids per prompt
    r = generate(
        server,
        {
            field: prompts,
            "rid": ["b-0", "b-1"],
            "sampling_params": [{"max_new_tokens": 5, **GREEDY}, {"max_new_tokens": 9, **GREEDY}],
        },
    )
    assert [(o["meta_info"]["id"], o["meta_info"]["completion_tokens"]) for o in r.json()] == [("b-0", 5), ("b-1", 9)]


def test_a_streamed_batch_tags_each_event_with_its_prompts_index(server):
    texts = [PROMPT, "The tired river listened under the bridge. "]
    alone = [one(server, t, 20) for t in texts]
    events = sse(generate(server, {"text": texts, "sampling_params": {"max_new_tokens": 20, **GREEDY}, "stream": True}))
    assert {e["index"] for e in events} == {0, 1}
    for i in (0, 1):
        mine = [e for e in events if e["index"] == i]
        counts = [e["meta_info"]["completion_tokens"] for e in mine]
        assert counts == sorted(counts) and counts[-1] == 20
        assert mine[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
        assert mine[-1]["output_ids"] == alone[i]["output_ids"]
        assert len({e["meta_info"]["id"] for e in mine}) == 1


@pytest.mark.parametrize(
    "body,named",
    [
        ({"text": []}, "empty batch"),
        ({"text": ["a", "b"], "sampling_params": [{"temperature": 0}]}, "sampling_params"),
        ({"text": ["a", "b"], "rid": "x"}, "rid"),
        ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid"),
        ({"text": ["a", 5], "sampling_params": {"temperature": 0}}, "text[1]"),
        ({"input_ids": [[1, 2], [999]], "sampling_params": {"temperature": 0}}, "input_ids[1]"),
    ],
)
def test_a_bad_batch_is_a_400_naming_the_field(server, body, named):
    r = generate(server, body)
    assert r.status_code == 400 and named in r.json()["error"]["message"], r.text[:300]


# ---- info routes, /metrics -----------------------------------------------------------------------------
def test_server_info_has_what_sglangs_clients_read(server):
    info = requests.get(server.base_url + "/server_info", timeout=5).json()
    assert requests.get(server.base_url + "/get_server_info", timeout=5).json().keys() == info.keys()
    assert Path(info["tokenizer_path"]).is_absolute() and (Path(info["tokenizer_path"]) / "tokenizer.json").is_file()
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == info["max_running_requests"] == 16
    assert state["memory_usage"]["token_capacity"] == 16 * 1024
    # the engine's own version: the package's, and the commit of the code that answers
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+\+g[0-9a-f]{12}(\.dirty)?", info["version"]), info["version"]
    assert head.startswith(info["version"].split("+g")[1][:12])


def test_model_info_names_absolute_paths(server):
    for route in ("/model_info", "/get_model_info"):
        info = requests.get(server.base_url + route, timeout=5).json()
        assert info["model_path"] == info["tokenizer_path"] == str(TARGET.resolve())  # given relative
        assert info["served_model_name"] == SERVED and not Path(SERVED).is_absolute()
        assert info["is_generation"] is True and info["architectures"] == ["LlamaForCausalLM"]


METRIC = re.compile(r"^(sglang:[a-z0-9_]+)\{([^}]*)\} (\S+)$")


def scrape(srv) -> dict[str, float]:
    """/metrics, read strictly: every sample line of the text format, HELP/TYPE before each family."""
    r = requests.get(srv.base_url + "/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples, typed = {}, set()
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif not line.startswith("# HELP "):
            m = METRIC.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.groups()
            assert re.sub(r"_(bucket|sum|count)$", "", name) in typed or name in typed, line
            assert 'engine_type="unified"' in labels and f'model_name="{SERVED}"' in labels
            samples[name + ("{" + labels.split(",le=")[1] + "}" if ",le=" in labels else "")] = float(value)
    return samples


def test_metrics_count_what_the_requests_did(server):
    before = scrape(server)
    out = one(server, PROMPT, 30)["meta_info"]
    after = scrape(server)
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 1
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == len(PROMPT)
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 30
    assert after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"] == out["spec_verify_ct"]
    count = "sglang:e2e_request_latency_seconds_count"
    assert (
        after[count] - before[count] == 1 and after['sglang:e2e_request_latency_seconds_bucket{"+Inf"}'] == after[count]
    )
    assert after["sglang:spec_num_steps"] == STEPS and after["sglang:cached_tokens_total"] == 0


# ---- the OpenAI routes ---------------------------------------------------------------------------------
def test_v1_completions_and_chat_answer_in_openai_schema_with_usage(server):
    alone = one(server, PROMPT, 12)
    r = requests.post(
        server.base_url + "/v1/completions",
        json={"model": "m", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "return_spec_tokens_details": True},
        timeout=60,
    ).json()
    assert r["object"] == "text_completion" and r["model"] == "m"
    assert r["choices"][0]["text"] == alone["text"] and r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["prompt_tokens"] == len(PROMPT) and r["usage"]["completion_tokens"] == 12
    assert r["usage"]["total_tokens"] == len(PROMPT) + 12
    assert r["sglext"]["spec_tokens_details"][0]["spec_verify_ct"] > 0
    # a batch of prompts (strings or token ids): one choice each, in order
    r = requests.post(
        server.base_url + "/v1/completions",
        json={"prompt": [list(PROMPT.encode()), list(b"The cat")], "max_tokens": 12, "temperature": 0},
        timeout=60,
    ).json()
    assert [c["index"] for c in r["choices"]] == [0, 1] and r["choices"][0]["text"] == alone["text"]
    assert r["usage"]["completion_tokens"] == 24 and r["model"] == SERVED
    chat = requests.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": 7, "temperature": 0},
        timeout=60,
    ).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 7 and len(chat["choices"][0]["message"]["content"]) == 7


@pytest.mark.parametrize(
    "route,body,named",
    [
        ("/v1/completions", {"prompt": "a", "max_tokens": 3}, "temperature"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 3, "temperature": 0, "n": 2}, "n=2"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 5000, "temperature": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": [], "temperature": 0}, "prompt"),
        ("/v1/chat/completions", {"messages": [], "temperature": 0}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}], "temperature": 0}, "messages[0]"),
    ],
)
def test_a_bad_openai_body_is_a_400_naming_the_field(server, route, body, named):
    r = requests.post(server.base_url + route, json=body, timeout=30)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["object"] == "error" and named in r.json()["message"]


def test_v1_models_lists_the_served_model(server):
    models = requests.get(server.base_url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [SERVED]
    assert models["data"][0]["max_model_len"] == 1024


# Long enough that a stream has several events even when the machine starves the front: the decode loop
# never waits for the client, so a front descheduled for a whole short generation (40 tokens, ~0.1 s here)
# rightly sends it as one event (a slow reader gets the newest state, as SGLang's does); a fresh clone's run
# under load once saw exactly that.
STREAM_TOKENS = 200


def test_v1_streams_deltas_that_add_up_to_the_answer(server):
    alone = one(server, PROMPT, STREAM_TOKENS)
    body = {
        "prompt": PROMPT,
        "max_tokens": STREAM_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse(requests.post(server.base_url + "/v1/completions", json=body, timeout=60))
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert len(texts) > 2 and "".join(texts) == alone["text"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == STREAM_TOKENS
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_the_openai_client_streams_a_completion_and_a_chat(server):
    need("openai")
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    alone = one(server, PROMPT, STREAM_TOKENS)
    stream = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=STREAM_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2 and "".join(texts) == alone["text"]  # several deltas, nothing lost or repeated
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == STREAM_TOKENS and chunks[-1].usage.prompt_tokens == len(PROMPT)
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_completion_tokens=16,
        temperature=0,
        stream=True,
    )
    deltas = [c.choices[0].delta for c in chat if c.choices]
    assert deltas[0].role == "assistant" and len("".join(d.content or "" for d in deltas)) == 16


# ---- SGLang's own tools --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sglang_tools(tmp_path_factory):
    """``python tests/sglang_client.py --serve``: SGLang imported once for the module's four tool runs (each
    import ~4.5 s of CPU); each run is still its own process (a fork of that one, tests/sglang_client.py)."""
    need("sglang")
    log = tmp_path_factory.mktemp("sglang_tools") / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "sglang_client.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
    proc.log = log
    yield proc
    proc.stdin.close()
    try:
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def sglang_tool(tools, tmp_path: Path, module: str, *args: str) -> str:
    """Run one of SGLang's client tools against the server (tests/sglang_client.py), offline; its stdout."""
    out, err = tmp_path / "tool.stdout", tmp_path / "tool.stderr"
    req = {"module": module, "args": list(args), "cwd": str(tmp_path), "stdout": str(out), "stderr": str(err)}
    tools.stdin.write(json.dumps({**req, "timeout_s": 300}) + "\n")  # the tools write result files into the cwd
    tools.stdin.flush()
    while (line := tools.stdout.readline()) and not line.startswith("TOOL_EXIT "):
        pass
    assert line, f"tests/sglang_client.py --serve exited {tools.poll()}:\n{tools.log.read_text()[-3000:]}"
    stdout, stderr = out.read_text(), err.read_text()
    assert int(line.split()[1]) == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


@pytest.fixture(scope="module")
def sharegpt(tmp_path_factory) -> Path:
    """Our prompt set as a ShareGPT file: the local dataset SGLang's random datasets sample from."""
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    convs = [
        {"conversations": [{"from": "human", "value": r["text"]}, {"from": "gpt", "value": r["text"]}]} for r in rows
    ]
    path = tmp_path_factory.mktemp("dataset") / "sharegpt.json"
    path.write_text(json.dumps(convs))
    return path


@pytest.mark.parametrize(
    "backend,dataset",
    [("sglang", ["--dataset-name", "random"]), ("sglang-oai", ["--dataset-name", "random-ids"])],
    ids=["sglang-local-dataset", "sglang-oai-random-ids"],
)
def test_sglang_bench_serving_completes_with_no_failed_request(
    server, sglang_tools, tmp_path, sharegpt, backend, dataset
):
    """`python -m sglang.bench_serving`: the native backend on a local dataset (tokenizer from our
    /model_info), the OpenAI one on random token ids (tokenizer named): every request succeeds."""
    n = 8
    tokenizer = [] if backend == "sglang" else ["--tokenizer", str(TARGET)]
    out = sglang_tool(
        sglang_tools,
        tmp_path,
        "sglang.bench_serving",
        *("--backend", backend, "--base-url", server.base_url, *dataset, "--dataset-path", str(sharegpt)),
        *("--random-input-len", "48", "--random-output-len", "32", "--random-range-ratio", "1"),
        *("--num-prompts", str(n), "--output-file", "out.jsonl", *tokenizer),
    )
    result = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[-1])
    assert result["completed"] == n, out[-2000:]
    assert re.search(rf"Successful requests:\s+{n}\b", out)
    assert result["total_output_tokens"] == n * 32  # ignore_eos: every request ran to its length
    assert result["accept_length"] > 1  # read from our /server_info, after the run


def test_sglang_bench_one_batch_server_completes(server, sglang_tools, tmp_path, sharegpt):
    """Batches of 1 and 2 (a list of input_ids, streamed with ``index``), sizes checked against our
    /server_info's effective_max_running_requests_per_dp, tokenizer from its tokenizer_path."""
    out = sglang_tool(
        sglang_tools,
        tmp_path,
        "sglang.bench_one_batch_server",
        *("--model-path", str(TARGET), "--base-url", server.base_url, "--skip-warmup"),
        *("--batch-size", "1", "2", "--input-len", "32", "--output-len", "16"),
        *("--dataset-name", "random", "--dataset-path", str(sharegpt), "--result-filename", "r.jsonl"),
    )
    assert "max_running_requests_per_dp=16" in out
    assert re.findall(r"^batch size: (\d+)$", out, re.M) == ["1", "2"]
    assert len(re.findall(r"^acc_length: \d", out, re.M)) == 2
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["batch_size"] for r in rows] == [1, 2]


def test_sglang_send_one_batch_of_two_completes(server, sglang_tools, tmp_path):
    out = sglang_tool(
        sglang_tools,
        tmp_path,
        "sglang.test.send_one",
        "--base-url",
        server.base_url,
        "--batch-size",
        "2",
        "--max-new-tokens",
        "48",
    )
    row = re.search(r"\|\s*([\d.]+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|", out)
    assert row and int(row.group(2)) == 48 and float(row.group(3)) > 1, out[-1500:]  # tokens, accept length
