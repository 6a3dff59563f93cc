"""The embedded engine under concurrency on CUDA (issue 28; marker `gpu`; run on the device, never in CI):

    timeout 300 python -m pytest -n 0 -m gpu -q tests/gpu/test_engine_concurrency.py

- ``--cuda-eager-batching``: the packed (eager) continuous-batching path on the GPU; 16 concurrent
  requests (the load prompt set) return exactly the tokens each returns alone, and really ran batched
  (the decode log's ``#running-req``), baseline and steps 3;
- default (the static / CUDA-graph path): concurrent requests run batched in the graph buckets and
  return their alone outputs; with --cuda-graph-max-bs-decode 4 the batches above 4 run eagerly
  (said in the log, ``cuda graph: False`` on their decode lines) and still do.
Every wait is bounded (server start 300 s, request 120 s).
"""

from __future__ import annotations

import json
import sys
import threading

import pytest
import requests

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from spec_decode.engines.server_process import ServerProcess, free_port  # noqa: E402
from spec_decode.parsers.decode_log import read_log  # noqa: E402

from ..conftest import ROOT, TARGET  # noqa: E402
from ..integration.engine_args import spec_flags  # noqa: E402

LOAD = ROOT / "data" / "prompts_load.jsonl"
TOKENS = 64


def bodies() -> list[dict]:
    texts = [json.loads(line)["text"] for line in LOAD.read_text().splitlines() if line.strip()]
    return [
        {"text": t, "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True}} for t in texts
    ]


def server(tmp_path, name: str, steps: int, *flags: str) -> ServerProcess:
    port = free_port()
    spec = spec_flags(steps) if steps else []
    argv = [
        sys.executable,
        "-m",
        "spec_decode.engines.embedded",
        "--model-path",
        str(TARGET),
        *spec,
        "--device",
        "cuda",
        "--port",
        str(port),
        "--decode-log-interval",
        "1",
        "--max-running-requests",
        "16",
        *flags,
    ]
    return ServerProcess(
        argv, env={}, log_path=tmp_path / f"{name}.log", host="127.0.0.1", port=port, startup_timeout_s=300
    )


def all_at_once(url: str, work: list[dict]) -> list[list[int]]:
    out: list = [None] * len(work)

    def one(i: int) -> None:
        out[i] = requests.post(url + "/generate", json=work[i], timeout=120).json()["output_ids"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    return out


@pytest.mark.parametrize("steps", [0, 3])
def test_eager_batching_on_cuda_equals_each_request_alone(tmp_path, steps):
    work = bodies()
    with server(tmp_path, f"eager{steps}", steps, "--cuda-eager-batching") as srv:
        alone = [requests.post(srv.base_url + "/generate", json=b, timeout=120).json()["output_ids"] for b in work]
        together = all_at_once(srv.base_url, work)
    assert together == alone
    running = [int(x.fields["#running-req"]) for x in read_log(tmp_path / f"eager{steps}.log") if x.kind == "Decode"]
    assert max(running) >= 8, running  # they ran batched on the GPU


@pytest.mark.parametrize("steps", [0, 3])
def test_graph_path_batches_concurrent_requests_and_keeps_their_outputs(tmp_path, steps):
    work = bodies()
    with server(tmp_path, f"graphs{steps}", steps, "--cuda-graph-max-bs-decode", "4") as srv:
        info = requests.get(srv.base_url + "/server_info", timeout=30).json()
        alone = [requests.post(srv.base_url + "/generate", json=b, timeout=120).json()["output_ids"] for b in work]
        together = all_at_once(srv.base_url, work)
    assert info["cuda_graph"] is True and info["cuda_graph_bs"] == [1, 2, 4], info
    assert together == alone
    lines = [x for x in read_log(tmp_path / f"graphs{steps}.log") if x.kind == "Decode"]
    graph = {int(x.fields["#running-req"]): x.fields["cuda graph"] for x in lines}
    assert max(graph) >= 8, graph  # batched
    assert all(v is (n <= 4) for n, v in graph.items()), graph  # eager above the cap
    assert "above --cuda-graph-max-bs-decode 4" in (tmp_path / f"graphs{steps}.log").read_text()
