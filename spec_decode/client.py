"""HTTP client for the SGLang contract: /generate, /flush_cache, /server_info; typed run records."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

import requests


class ClientError(RuntimeError):
    """A request failed (HTTP error, timeout, connection lost)."""


@dataclass
class RunRecord:
    """One timed /generate call, measured by the client."""

    launch: int
    run: int
    start_wall: float  # time.time() at send; windows the profile lines
    end_wall: float
    wall_s: float  # client-side perf_counter duration
    prompt_tokens: int
    completion_tokens: int
    e2e_latency_s: Optional[float] = None  # server-side
    spec_verify_ct: Optional[int] = None
    spec_num_correct_drafts: Optional[int] = None
    spec_num_proposed_drafts: Optional[int] = None

    @property
    def throughput_tok_s(self) -> float:
        return self.completion_tokens / self.wall_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throughput_tok_s": self.throughput_tok_s}


class Client:
    def __init__(self, base_url: str, timeout_s: float):
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.session = requests.Session()

    def _call(self, method: str, path: str, **kw) -> requests.Response:
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
                "max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": ignore_eos,
            },
        }

    def generate(self, body: dict, launch: int, run: int) -> RunRecord:
        start_wall = time.time()
        t0 = time.perf_counter()
        data = self._call("POST", "/generate", json=body).json()
        wall = time.perf_counter() - t0
        meta = data.get("meta_info", {})
        return RunRecord(
            launch=launch, run=run, start_wall=start_wall, end_wall=time.time(), wall_s=wall,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", len(data.get("output_ids", [])))),
            e2e_latency_s=meta.get("e2e_latency"),
            spec_verify_ct=meta.get("spec_verify_ct"),
            spec_num_correct_drafts=meta.get("spec_num_correct_drafts"),
            spec_num_proposed_drafts=meta.get("spec_num_proposed_drafts"),
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
                    raise ClientError(f"{e} -- the server did not become idle for /flush_cache within "
                                      f"{wait_s:.0f}s after the warmup") from None
                time.sleep(0.2)

    def server_info(self) -> dict:
        return self._call("GET", "/server_info").json()
