"""The lossless guard: greedy speculative decoding must return the baseline's tokens (pure functions).

For a greedy job with a baseline arm, each spec request's ``output_ids`` are compared with the
baseline's output for the same prompt (Spec-Bench's ``evaluation/equal.py`` idea, on token ids):
the timed runs against the baseline's runs of the same prompt (the paired baseline server's, else the
baseline job's), the request pass against the baseline job's request pass by prompt index.

Match rule: equal on their common length. The speculative engine's last cycle may commit a few tokens
past ``max_new_tokens``, so a longer output that agrees on the baseline's length matches; a shorter
output that stopped before ``max_new_tokens`` (an EOS the other did not take) diverges where it stopped.

Verdicts: ``pass`` (all matched); ``fail`` on the embedded engine (its decoding is exact: a mismatch is a
bug, a failed check); ``warn`` on SGLang (GPU kernels are not always batch-invariant: a warning with
the position); ``skipped`` with the reason for performance-only records (forced acceptance), sampling
(temperature > 0), no baseline, or no output ids to compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from spec_decode.record.results import Check
from spec_decode.record.sections import Lossless

PERFORMANCE_ONLY = "performance-only (forced acceptance)"


@dataclass(frozen=True)
class Comparison:
    """One spec request and the baseline's output for the same prompt."""

    key: str  # "<prompt_index>" for the request pass, "timed:<prompt_index>" for the timed runs
    spec_ids: Optional[list[int]]
    base_ids: Optional[list[int]]
    max_new_tokens: int


def first_divergence(spec: list[int], base: list[int], max_new_tokens: int) -> Optional[int]:
    """The first position (0-based, in generated tokens) where the outputs differ; None if they match."""
    n = min(len(spec), len(base))
    for i in range(n):
        if spec[i] != base[i]:
            return i
    if len(spec) != len(base) and n < max_new_tokens:
        return n  # one stopped early, the other went on
    return None


def skipped(reason: str) -> Lossless:
    return Lossless(
        checked=False,
        requests=0,
        matched=0,
        match_rate=None,
        first_divergence={},
        verdict="skipped",
        reason=reason,
    )


def guard(
    comparisons: list[Comparison], exact: bool, temperature: float, performance_only: bool, has_baseline: bool
) -> Lossless:
    """The job's ``lossless`` section: ``{checked, requests, matched, match_rate, first_divergence:
    {key: position}, verdict: pass|fail|warn|skipped, reason}``. ``exact``: the engine decodes exactly
    (``engines.engine.Engine.exact_outputs``), so a divergence fails; else it warns."""
    if performance_only:
        return skipped(PERFORMANCE_ONLY)
    if temperature > 0:
        return skipped(f"sampling (temperature {temperature:g} > 0): outputs may differ legitimately")
    if not has_baseline:
        return skipped("no baseline arm to compare with")
    usable = [c for c in comparisons if c.spec_ids is not None and c.base_ids is not None]
    if not usable:
        return skipped(
            "no output ids to compare (the server returned none, or the baseline has none for these prompts)"
        )
    first: dict[str, int] = {}
    matched = 0
    for c in usable:
        pos = first_divergence(c.spec_ids, c.base_ids, c.max_new_tokens)  # type: ignore[arg-type]
        if pos is None:
            matched += 1
        else:
            first[c.key] = min(pos, first.get(c.key, pos))
    n = len(usable)
    missing = len(comparisons) - n
    note = f"; {missing} request(s) without output ids not compared" if missing else ""
    if matched == n:
        verdict, reason = "pass", f"{n} of {n} outputs equal the baseline's{note}"
    else:
        where = ", ".join(f"prompt {k} at token {p}" for k, p in sorted(first.items()))
        verdict = "fail" if exact else "warn"
        why = (
            "the embedded engine decodes exactly: speculation changed the output"
            if verdict == "fail"
            else "SGLang's GPU kernels are not always batch-invariant: check whether it is the kernels"
        )
        reason = f"{n - matched} of {n} outputs differ from the baseline's (first divergence: {where}); {why}{note}"
    return Lossless(
        checked=True,
        requests=n,
        matched=matched,
        match_rate=matched / n,
        first_divergence=first,
        verdict=verdict,
        reason=reason,
    )


def check_of(lossless: Lossless | None) -> Optional[Check]:
    """The failed/passed check for a checked embedded job (``warn`` and ``skipped`` give none: SGLang's
    mismatch is a warning, a skipped guard compared nothing)."""
    if lossless is None or lossless.verdict not in ("pass", "fail"):
        return None
    return Check(
        "lossless_vs_baseline",
        lossless.verdict == "pass",
        lossless.match_rate,
        "match_rate == 1.0 (greedy: the baseline's tokens)",
        lossless.reason,
    )
