"""The request pass (``benchmark.request_pass``): after the timed runs, one streamed greedy request per
prompt of ``benchmark.request_prompts``; per-request entries, per-category aggregates, outputs file.

Each request's entry (the record's ``requests``) holds its counters and the hash of its output ids;
the ids themselves go to ``outputs.jsonl`` in the job dir (one line per request), where the lossless
guard of a later spec job reads the baseline's. Per category: ``n``, accept length = sum of completion
tokens / sum of verify counts (the run-scoped convention, over the category's requests) and the median
request tok/s (client wall clock, like the timed runs).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

from spec_decode.analysis.sections import Section
from spec_decode.core.prompts import Prompt
from spec_decode.runner.client import RunRecord

OUTPUTS_FILE = "outputs.jsonl"
# The paired baseline server's request pass (benchmark.paired): the lossless guard's reference for the requests.
PAIRED_OUTPUTS_FILE = "baseline.outputs.jsonl"


def entry(prompt: Prompt, r: RunRecord) -> dict:
    """One request's entry (contract ``requests``)."""
    return {
        "prompt_index": prompt.index,
        "category": prompt.category,
        "completion_tokens": r.completion_tokens,
        "wall_s": r.wall_s,
        "throughput_tok_s": r.throughput_tok_s,
        "accept_len": r.completion_tokens / r.spec_verify_ct if r.spec_verify_ct else None,
        "verify_ct": r.spec_verify_ct,
        "correct_drafts": r.spec_num_correct_drafts,
        "histogram": r.spec_correct_drafts_histogram,
        "ttft_ms": 1e3 * r.ttft_s if r.ttft_s is not None else None,
        "output_sha256": r.output_sha256,
    }


def categories(entries: list[dict]) -> dict[str, dict]:
    """``{name: {n, accept_len, throughput_tok_s}}`` in first-seen order; accept_len None without
    verify counts (a baseline)."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(e["category"], []).append(e)
    out = {}
    for name, es in groups.items():
        verify = [e["verify_ct"] for e in es]
        accept = sum(e["completion_tokens"] for e in es) / sum(verify) if all(v for v in verify) else None
        out[name] = {
            "n": len(es),
            "accept_len": accept,
            "throughput_tok_s": statistics.median(e["throughput_tok_s"] for e in es),
        }
    return out


def metrics_of(cats: dict[str, dict]) -> dict[str, float]:
    """Flat metrics: ``category_<name>_accept_len``, ``category_<name>_throughput_tok_s``."""
    out = {}
    for name, c in cats.items():
        if c["accept_len"] is not None:
            out[f"category_{name}_accept_len"] = c["accept_len"]
        out[f"category_{name}_throughput_tok_s"] = c["throughput_tok_s"]
    return out


def categories_section(entries: list[dict]) -> Section:
    """The record's ``categories`` section and its metrics."""
    cats = categories(entries)
    return Section({"categories": cats}, metrics_of(cats))


def write_outputs(out_dir: Path, prompts: list[Prompt], runs: list[RunRecord], name: str = OUTPUTS_FILE) -> Path:
    """``outputs.jsonl``: one line per request, ``{prompt_index, category, output_sha256, output_ids}``."""
    path = Path(out_dir) / name
    with open(path, "w") as f:
        for p, r in zip(prompts, runs):
            f.write(
                json.dumps(
                    {
                        "prompt_index": p.index,
                        "category": p.category,
                        "output_sha256": r.output_sha256,
                        "output_ids": r.output_ids,
                    }
                )
                + "\n"
            )
    return path


def read_outputs(out_dir: Optional[str | Path], name: str = OUTPUTS_FILE) -> dict[int, list[int]]:
    """prompt index -> output ids from a job dir's ``outputs.jsonl`` (empty if it has none)."""
    if not out_dir:
        return {}
    path = Path(out_dir) / name
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if isinstance(row.get("output_ids"), list):
                out[int(row["prompt_index"])] = row["output_ids"]
    return out
