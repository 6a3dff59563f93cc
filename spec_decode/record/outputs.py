"""A job's output ids, beside its results.json: ``outputs.jsonl`` (the request pass, one line per request:
``{prompt_index, category, output_sha256, output_ids}``), and under the paired strategy the baseline
server's ``baseline.outputs.jsonl``. The runner writes them (``write``); the lossless guard of this job,
and of a later spec job against this baseline, reads them (``read``).
"""

from __future__ import annotations

import json
from pathlib import Path

from spec_decode.core.prompts import Prompt
from spec_decode.record.runs import RunRecord

FILE = "outputs.jsonl"
# The paired baseline server's request pass (benchmark.paired): the lossless guard's reference for the requests.
PAIRED_FILE = "baseline.outputs.jsonl"


def write(out_dir: Path, prompts: list[Prompt], runs: list[RunRecord], name: str = FILE) -> Path:
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


def read(out_dir: str | Path | None, name: str = FILE) -> dict[int, list[int]]:
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
