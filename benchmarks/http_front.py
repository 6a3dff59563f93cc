"""What does the embedded engine's HTTP front cost per request, against SGLang's HTTP stack (FastAPI +
uvicorn + pydantic)? Side by side in one process, over one set of rank processes:

    python benchmarks/http_front.py [--rounds 200] [--tokens 4] [--steps 3]

The engine's own front (``http.server``, handler.py) and a FastAPI app served by uvicorn answer from
the same ``EngineState`` (same ranks, same decoding), each on its own port; a keep-alive client
alternates requests between them (ABBA), for ``GET /health`` (the stack alone) and a short ``POST
/generate`` (parse, submit to the ranks, answer). Prints per-front medians and quartiles of the client's
latency and the median per-pair difference. Results: docs/embedded-engine.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import requests
from fastapi import FastAPI, Request  # module level: the route signatures are strings (annotations)
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The old robot sleeps in the garden. "


def fastapi_app(state):
    """SGLang's stack: FastAPI routes, a pydantic-free dict body, sync handlers (run in uvicorn's
    thread pool, as the engine's calls block), JSON answers."""
    app = FastAPI()

    @app.get("/health")
    def health():
        return PlainTextResponse("OK")

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        batch = state.parse(body)
        if batch.stream:  # SGLang's own shape: a StreamingResponse of "data: ..." events
            events = state.stream(batch.reqs[0])

            def sse():
                for out in events:
                    yield b"data: " + json.dumps(out).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        out = await asyncio.to_thread(state.generate, batch.reqs[0])
        return JSONResponse(out)

    return app


def start(tokens: int, steps: int):
    from spec_decode.engines.embedded.handler import serve
    from spec_decode.engines.embedded.ranks import RankGroup
    from spec_decode.engines.embedded.server import EngineState, bind
    from spec_decode.engines.embedded.server_args import RankSpec
    from spec_decode.engines.server_process import free_port

    model, drafter = ROOT / "models" / "tiny" / "target", ROOT / "models" / "tiny" / "drafter"
    spec = RankSpec(
        model_path=str(model),
        draft_model_path=str(drafter) if steps else None,
        steps=steps,
        tp_size=1,
        device="cpu",
        cpu_threads=1,
        random_seed=0,
        decode_log_interval=1000,
        log_level="warning",
        dist_port=0,
        front_pid=0,
    )
    group = RankGroup(spec)
    state = EngineState(group, {"model_path": str(model)}, 1024, steps, speculative=bool(steps))
    ours = bind("127.0.0.1", free_port())
    threading.Thread(target=serve, args=(ours, state), daemon=True).start()

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(fastapi_app(state), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    urls = {"http.server": f"http://127.0.0.1:{ours.server_address[1]}", "fastapi+uvicorn": f"http://127.0.0.1:{port}"}
    for url in urls.values():
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, url
            time.sleep(0.1)
    return group, urls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--stream-tokens", type=int, default=64, help="new tokens of the streamed request")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    group, urls = start(args.tokens, args.steps)
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": args.tokens, "temperature": 0, "ignore_eos": True}}
    sessions = {name: requests.Session() for name in urls}
    names = list(urls)
    try:
        stream_body = {**body, "stream": True, "sampling_params": {**body["sampling_params"]}}
        stream_body["sampling_params"]["max_new_tokens"] = args.stream_tokens
        for route in ("GET /health", "POST /generate", "POST /generate stream"):
            ms: dict[str, list[float]] = {n: [] for n in names}
            outputs = {}
            for i in range(args.rounds + 5):
                order = names if i % 2 == 0 else names[::-1]  # ABBA
                for name in order:
                    t0 = time.perf_counter()
                    if route == "GET /health":
                        r = sessions[name].get(urls[name] + "/health", timeout=30)
                    elif route == "POST /generate":
                        r = sessions[name].post(urls[name] + "/generate", json=body, timeout=30)
                        assert r.status_code == 200, (name, r.text[:300])
                        outputs[name] = r.json()["output_ids"]
                    else:
                        r = sessions[name].post(urls[name] + "/generate", json=stream_body, timeout=30, stream=True)
                        events = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
                        assert events[-1] == b"[DONE]", (name, events[-2:])
                        outputs[name] = json.loads(events[-2])["output_ids"]
                    dt = (time.perf_counter() - t0) * 1e3
                    assert r.status_code == 200, r.text[:200]
                    if i >= 5:  # warm-up rounds dropped
                        ms[name].append(dt)
            if outputs:
                assert outputs[names[0]] == outputs[names[1]]
            diffs = [b - a for a, b in zip(ms[names[0]], ms[names[1]])]
            n = args.stream_tokens if "stream" in route else args.tokens
            print(f"{route} ({args.rounds} pairs{', %d tokens' % n if 'generate' in route else ''}):")
            for name in names:
                q = statistics.quantiles(ms[name], n=4)
                print(f"  {name:16s} median {statistics.median(ms[name]):7.3f} ms  quartiles {q[0]:.3f}-{q[2]:.3f}")
            print(f"  fastapi+uvicorn - http.server, per pair: median {statistics.median(diffs):+.3f} ms")
    finally:
        group.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
