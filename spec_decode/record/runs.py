"""RunRecord: one timed /generate call as the client measured it (``runner.client`` fills it; the job's
record holds a list of them). A record type, so it lives with the record, below the code that fills it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Optional


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
    output_ids: Optional[list[int]] = None  # the generated token ids (the lossless guard compares them)
    spec_correct_drafts_histogram: Optional[list[int]] = None  # index a: verify cycles that accepted a drafts
    ttft_s: Optional[float] = None  # streamed: send -> first chunk with >= 1 token
    token_gaps_s: Optional[list[float]] = None  # streamed: one gap per token after the first (spreading rule)
    stream: bool = False
    rid: Optional[str] = None  # meta_info "id" (SGLang's rid): the profile's cycles are attributed by it

    @property
    def throughput_tok_s(self) -> float:
        return self.completion_tokens / self.wall_s

    @property
    def output_sha256(self) -> Optional[str]:
        return output_sha256(self.output_ids)

    def as_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "throughput_tok_s": self.throughput_tok_s}
        if self.token_gaps_s is not None:  # microseconds are the clock's useful resolution here
            d["token_gaps_s"] = [round(g, 7) for g in self.token_gaps_s]
        return d


def output_sha256(ids: Optional[list[int]]) -> Optional[str]:
    """A stable hash of a token-id list (the ids as a JSON list, no spaces)."""
    if ids is None:
        return None
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()
