"""HTTP client for the SGLang contract: /generate, /flush_cache, /server_info; typed run records.

Streaming (``Client.generate(..., stream=True)``) reads SGLang 0.5.23's server-sent events: chunks
``data: {json}\n\n``, the last ``data: [DONE]\n\n``. A chunk's new tokens are the increase of its
cumulative ``meta_info.completion_tokens`` (so it does not matter whether ``output_ids`` are cumulative,
SGLang's default, or incremental, ``--stream-output``). Timing, all on the client's clock:

- TTFT: send -> the first chunk that carries >= 1 token;
- token gaps (the spreading rule): a chunk of n new tokens that arrives g seconds after the previous
  token-carrying chunk adds n gaps of g/n -- a verify cycle that commits 4 tokens in 12 ms counts as 4
  tokens 3 ms apart, not one 12 ms gap (SGLang's bench_serving counted per chunk until sglang#12064).
  The first chunk's extra tokens (n > 1 in the first chunk) add gaps of 0. So there are
  completion_tokens - 1 gaps per request;
- wall_s: send -> the end of the stream (``[DONE]``); throughput stays completion_tokens / wall_s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from spec_decode.record.runs import RunRecord, output_sha256

if TYPE_CHECKING:
    import requests

# requests (and urllib3) are imported where a request is made: ~50 ms of CPU that a run.py stopping in
# preflight, at a config error or at a dry run never needs (this module is on its import path).

__all__ = ["Client", "ClientError", "RunRecord", "output_sha256"]


class ClientError(RuntimeError):
    """A request failed (HTTP error, timeout, connection lost)."""


@dataclass
class StreamChunk:
    """One server-sent event's JSON and the client clock when its bytes had arrived."""

    t: float  # perf_counter
    data: dict


def read_events(raw, t_read=time.perf_counter) -> Iterator[StreamChunk]:
    """SSE events from a streamed body: each ``data: ...`` line's JSON, stamped when the read that
    completed it returned, up to ``data: [DONE]``. Reads with ``read1`` (as soon as any bytes arrive,
    chunked or not): ``iter_lines``' fixed-size reads would wait for 512 bytes before a short chunk."""
    buf = b""
    while True:
        data = raw.read1(65536)
        t = t_read()
        if not data:
            if buf.strip():
                raise ClientError(f"stream ended inside an event: {buf[:200]!r}")
            raise ClientError("stream ended without `data: [DONE]`")
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line or line.startswith(b":"):  # event separator, SSE comment
                continue
            if not line.startswith(b"data:"):
                continue  # event:/id:/retry: fields carry nothing we use
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            try:
                obj = json.loads(payload)
            except json.JSONDecodeError as e:
                raise ClientError(f"stream chunk is not JSON ({e.msg}): {payload[:200]!r}") from None
            if isinstance(obj, dict) and "error" in obj:  # SGLang reports a failure mid-stream this way
                raise ClientError(f"stream error from the server: {json.dumps(obj['error'])[:500]}")
            if not isinstance(obj, dict):
                raise ClientError(f"stream chunk is not a JSON object: {payload[:200]!r}")
            yield StreamChunk(t, obj)


class Client:
    def __init__(self, base_url: str, timeout_s: float):
        import requests  # lazy: start-up cost (the note after the imports)

        self.base_url = base_url
        self.timeout_s = timeout_s
        self.session = requests.Session()

    def _call(self, method: str, path: str, **kw) -> requests.Response:
        import requests  # lazy: start-up cost (the note after the imports)

        try:
            r = self.session.request(method, self.base_url + path, timeout=self.timeout_s, **kw)
        except requests.Timeout:
            raise ClientError(
                f"{method} {path}: no answer within {self.timeout_s:.0f}s (engine.request_timeout_s)"
            ) from None
        except requests.RequestException as e:
            raise ClientError(f"{method} {path}: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise ClientError(f"{method} {path}: HTTP {r.status_code}: {r.text[:500]}")
        return r

    def generate_body(self, prompt: str, max_new_tokens: int, temperature: float, ignore_eos: bool) -> dict:
        return {
            "text": prompt,
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": temperature,
                "ignore_eos": ignore_eos,
            },
        }

    def generate(self, body: dict, launch: int, run: int, stream: bool = False) -> RunRecord:
        """One /generate call, timed by the client. ``stream=True`` sends ``"stream": true`` and reads
        the server-sent events (TTFT, per-token gaps; see the module doc); the same throughput either way."""
        if stream:
            return self._generate_stream({**body, "stream": True}, launch, run)
        start_wall = time.time()
        t0 = time.perf_counter()
        data = self._call("POST", "/generate", json=body).json()
        wall = time.perf_counter() - t0
        meta = data.get("meta_info", {})
        ids = data.get("output_ids")
        return RunRecord(
            launch=launch,
            run=run,
            start_wall=start_wall,
            end_wall=time.time(),
            wall_s=wall,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", len(ids or []))),
            e2e_latency_s=meta.get("e2e_latency"),
            spec_verify_ct=meta.get("spec_verify_ct"),
            spec_num_correct_drafts=meta.get("spec_num_correct_drafts"),
            spec_num_proposed_drafts=meta.get("spec_num_proposed_drafts"),
            output_ids=list(ids) if isinstance(ids, list) else None,
            spec_correct_drafts_histogram=meta.get("spec_correct_drafts_histogram"),
            rid=meta.get("id"),
        )

    def _generate_stream(self, body: dict, launch: int, run: int) -> RunRecord:
        # lazy: start-up cost (the note after the imports)
        import requests
        import urllib3

        start_wall = time.time()
        t0 = time.perf_counter()
        r = self._call("POST", "/generate", json=body, stream=True)
        try:
            ctype = r.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise ClientError(
                    f'POST /generate with "stream": true: the server answered {ctype or "no Content-Type"}, '
                    f"not text/event-stream (it does not stream): {r.text[:200]}"
                )
            r.raw.decode_content = True
            tokens, ids, ids_ok = 0, [], True
            ttft = t_last = None
            gaps: list[float] = []
            meta: dict = {}
            try:
                for chunk in read_events(r.raw):
                    meta = chunk.data.get("meta_info") or {}
                    now = int(meta.get("completion_tokens", tokens))
                    new = now - tokens
                    if new < 0:
                        raise ClientError(f"stream: completion_tokens went down ({tokens} -> {now})")
                    chunk_ids = chunk.data.get("output_ids")
                    if isinstance(chunk_ids, list) and ids_ok:
                        if len(chunk_ids) == now:  # cumulative (SGLang's default)
                            ids = list(chunk_ids)
                        elif len(chunk_ids) == new:  # incremental (--stream-output)
                            ids.extend(chunk_ids)
                        else:
                            ids_ok = False  # neither: no ids rather than wrong ones
                    if new > 0:
                        if t_last is None:
                            ttft = chunk.t - t0
                            gaps.extend([0.0] * (new - 1))
                        else:
                            gaps.extend([(chunk.t - t_last) / new] * new)
                        t_last = chunk.t
                    tokens = now
                wall = time.perf_counter() - t0  # at [DONE]
            except (requests.Timeout, urllib3.exceptions.ReadTimeoutError, TimeoutError):
                raise ClientError(
                    f"POST /generate (stream): no data within {self.timeout_s:.0f}s (engine.request_timeout_s)"
                ) from None
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
                # a read timeout (engine.request_timeout_s between two chunks) or a dropped connection
                raise ClientError(f"POST /generate (stream): {type(e).__name__}: {e}") from None
        finally:
            r.close()
        return RunRecord(
            launch=launch,
            run=run,
            start_wall=start_wall,
            end_wall=time.time(),
            wall_s=wall,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=tokens,
            e2e_latency_s=meta.get("e2e_latency"),
            spec_verify_ct=meta.get("spec_verify_ct"),
            spec_num_correct_drafts=meta.get("spec_num_correct_drafts"),
            spec_num_proposed_drafts=meta.get("spec_num_proposed_drafts"),
            output_ids=ids if ids_ok and len(ids) == tokens else None,
            spec_correct_drafts_histogram=meta.get("spec_correct_drafts_histogram"),
            ttft_s=ttft,
            token_gaps_s=gaps if ttft is not None else None,
            stream=True,
            rid=meta.get("id"),
        )

    def flush_cache(self, wait_s: float = 30.0) -> None:
        """Reset the server's counters once it is idle. SGLang answers 400 unless the scheduler is
        fully idle (its default ``timeout=0``); ``?timeout=`` makes it wait for idle itself. Retried
        until ``wait_s`` has passed, then a clear error (a slow warmup tail must not fail the job)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._call("POST", f"/flush_cache?timeout={wait_s:g}")
                return
            except ClientError as e:
                if "HTTP 400" not in str(e) or time.monotonic() > deadline:
                    raise ClientError(
                        f"{e} -- the server did not become idle for /flush_cache within {wait_s:.0f}s after the warmup"
                    ) from None
                time.sleep(0.2)

    def server_info(self) -> dict:
        return self._call("GET", "/server_info").json()
