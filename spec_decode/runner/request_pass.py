"""The request pass (``benchmark.request_pass``): after the timed runs, one streamed greedy request per
prompt of ``benchmark.request_prompts`` (``run``); one entry per request (``entry``), the output ids to
``outputs.jsonl`` (``record.outputs``).

Each request's entry (the record's ``requests``) holds its counters and the hash of its output ids;
the ids themselves go to ``outputs.jsonl`` in the job dir (one line per request), where the lossless
guard of a later spec job reads the baseline's. The per-category figures are derived in
``analysis.categories``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spec_decode.core.config import BenchmarkConfig
from spec_decode.core.prompts import Prompt, load_prompt_set
from spec_decode.record import outputs
from spec_decode.record.measured import Request
from spec_decode.record.runs import RunRecord
from spec_decode.runner.client import Client


def entry(prompt: Prompt, r: RunRecord) -> Request:
    """One request's entry (contract ``requests``)."""
    return Request(
        prompt_index=prompt.index,
        category=prompt.category,
        completion_tokens=r.completion_tokens,
        wall_s=r.wall_s,
        throughput_tok_s=r.throughput_tok_s,
        accept_len=r.completion_tokens / r.spec_verify_ct if r.spec_verify_ct else None,
        verify_ct=r.spec_verify_ct,
        correct_drafts=r.spec_num_correct_drafts,
        histogram=r.spec_correct_drafts_histogram,
        ttft_ms=1e3 * r.ttft_s if r.ttft_s is not None else None,
        output_sha256=r.output_sha256,
    )


def run(
    b: BenchmarkConfig, prompts_path: Path, client: Client, launch: int, out: Path, name: str, quiet: bool
) -> list[Request]:
    """After the timed runs (outside their windows, so their numbers cannot change): one greedy request
    per prompt of benchmark.request_prompts (``prompts_path``, resolved) -> its entries (returned), the
    output ids -> ``out/name``."""
    prompts = load_prompt_set(prompts_path)
    if not quiet:
        print(
            f"[request pass] {len(prompts)} prompts of {b.request_prompts}, {b.request_max_new_tokens} tokens each "
            f"-> {name}",
            file=sys.stderr,
            flush=True,
        )
    runs = []
    for p in prompts:
        body = client.generate_body(p.text, b.request_max_new_tokens, b.temperature, b.ignore_eos)
        runs.append(client.generate(body, launch, p.index, stream=b.stream))
    outputs.write(out, prompts, runs, name)
    return [entry(p, r) for p, r in zip(prompts, runs)]
