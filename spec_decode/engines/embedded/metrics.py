"""``GET /metrics``: the embedded engine's counters in Prometheus' text format (version 0.0.4), under
SGLang 0.5.23's metric names and labels (``observability/metrics_collector.py``), so that a scraper or
``sglang.bench_one_batch_server`` (which reads ``sglang:prompt_tokens_total`` and
``sglang:cached_tokens_total``) reads them as it reads SGLang's. Written by hand: the front stays free
of a metrics package (prometheus_client is not a dependency), and the lines are few.

SGLang serves ``/metrics`` only with ``--enable-metrics``; ours always does (it costs a lock and a few
additions per finished request). Counters count finished requests since start (``/flush_cache`` does
not reset them, as SGLang's do not); the gauges are the rank's decode-log state
(``internal_states[0]`` of ``/server_info``).
"""

from __future__ import annotations

import math
import threading

# seconds; SGLang's e2e buckets are finer at the top end, these cover a tiny model's requests
E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)


def _labels(model_name: str) -> str:
    # SGLang's label set for a unified (not disaggregated) server with tp/pp/ep 1 as seen from rank 0
    escaped = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'model_name="{escaped}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def _number(v: float) -> str:
    return "+Inf" if v == math.inf else repr(float(v))


class Metrics:
    """Counters of finished requests, shared by the HTTP threads."""

    def __init__(self, model_name: str):
        self.labels = _labels(model_name)
        self.lock = threading.Lock()
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.verify_calls = 0
        self.e2e_counts = [0] * len(E2E_BUCKETS_S)  # per bucket (not cumulative)
        self.e2e_sum_s = 0.0

    def finished(self, prompt_tokens: int, completion_tokens: int, e2e_s: float, verify_ct: int) -> None:
        with self.lock:
            self.requests += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            self.verify_calls += verify_ct
            self.e2e_sum_s += e2e_s
            self.e2e_counts[next(i for i, b in enumerate(E2E_BUCKETS_S) if e2e_s <= b)] += 1

    def render(self, running: int, internal: dict, steps: int) -> str:
        """The exposition text: counters, the rank's gauges, the e2e latency histogram."""
        lab = self.labels
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            out.extend((f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{lab}}} {_number(value)}"))

        with self.lock:
            metric("sglang:num_requests_total", "counter", "Number of requests finished.", self.requests)
            metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens)
            metric("sglang:generation_tokens_total", "counter", "Number of generation tokens.", self.generation_tokens)
            metric("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens (no prefix cache).", 0)
            metric("sglang:spec_verify_calls_total", "counter", "Number of verify rounds.", self.verify_calls)
            counts, total_s = list(self.e2e_counts), self.e2e_sum_s
        metric("sglang:num_running_reqs", "gauge", "HTTP requests being answered (a batch counts once).", running)
        metric(
            "sglang:gen_throughput",
            "gauge",
            "Generation throughput (token/s).",
            internal.get("last_gen_throughput") or 0,
        )
        if steps:
            accept = internal.get("avg_spec_accept_length")
            metric("sglang:spec_accept_length", "gauge", "Accept length since the last flush.", accept or 0)
            metric("sglang:spec_num_steps", "gauge", "Draft steps.", steps)
            metric("sglang:spec_num_draft_tokens", "gauge", "Draft tokens per verify.", steps + 1)
        name = "sglang:e2e_request_latency_seconds"
        out += [f"# HELP {name} End-to-end request latency in seconds.", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(E2E_BUCKETS_S, counts):
            cumulative += n
            out.append(f'{name}_bucket{{{lab},le="{_number(bound)}"}} {_number(cumulative)}')
        out += [f"{name}_sum{{{lab}}} {_number(total_s)}", f"{name}_count{{{lab}}} {_number(cumulative)}"]
        return "\n".join(out) + "\n"
