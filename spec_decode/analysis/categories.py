"""The request pass per prompt category (the record's ``categories``): ``n``, accept length = sum of
completion tokens / sum of verify counts (the run-scoped convention, over the category's requests) and the
median request tok/s (client wall clock, like the timed runs), from the record's ``requests`` entries
(``runner.request_pass.entry``).
"""

from __future__ import annotations

import statistics

from spec_decode.analysis.sections import Section
from spec_decode.record.measured import Request
from spec_decode.record.sections import Category


def categories(entries: list[Request]) -> dict[str, Category]:
    """``{name: Category(n, accept_len, throughput_tok_s)}`` in first-seen order; accept_len None without
    verify counts (a baseline)."""
    groups: dict[str, list[Request]] = {}
    for e in entries:
        groups.setdefault(e.category, []).append(e)
    out = {}
    for name, es in groups.items():
        verify = [e.verify_ct for e in es]
        accept = sum(e.completion_tokens for e in es) / sum(verify) if all(v for v in verify) else None
        out[name] = Category(len(es), accept, statistics.median(e.throughput_tok_s for e in es))
    return out


def metrics_of(cats: dict[str, Category]) -> dict[str, float]:
    """Flat metrics: ``category_<name>_accept_len``, ``category_<name>_throughput_tok_s``."""
    out = {}
    for name, c in cats.items():
        if c.accept_len is not None:
            out[f"category_{name}_accept_len"] = c.accept_len
        out[f"category_{name}_throughput_tok_s"] = c.throughput_tok_s
    return out


def section(entries: list[Request]) -> Section:
    """The record's ``categories`` section and its metrics."""
    cats = categories(entries)
    return Section({"categories": cats}, metrics_of(cats))
