"""SGLang scheduler log lines (``Decode batch`` / ``Prefill batch``), old and new shapes.

Handles: ``Decode batch.`` (<= 0.5.4) and ``Decode batch,`` (current); rank tags like `` TP0 EP0``;
``.mmm`` milliseconds; `` [iter]`` after "batch"; a trailing ``, ``; ``cuda``/``cpu``/``npu graph``.
Values are kept as key -> float/bool/str; the caller decides which keys matter.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable

HEAD = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?)(?P<ranks>(?: [A-Z_]+\d+)*)\] "
    r"(?P<kind>Decode|Prefill) batch(?: \[(?P<iter>\d+)\])?[.,] (?P<body>.*)$"
)


@dataclass
class LogLine:
    kind: str  # Decode | Prefill
    ts: datetime
    ranks: list[str]
    fields: dict[str, float | bool | str]
    after_idle: bool = False  # first decode line after a prefill/idle gap: throughput understated


def _value(text: str) -> float | bool | str:
    if text in ("True", "False"):
        return text == "True"
    try:
        return float(text)
    except ValueError:
        return text


def parse_line(line: str) -> LogLine | None:
    m = HEAD.match(line.rstrip("\n"))
    if not m:
        return None
    body = m["body"].rstrip().rstrip(",")
    fields = {}
    for kv in body.split(", "):
        if ": " in kv:
            k, v = kv.split(": ", 1)
            fields[k.strip()] = _value(v.strip())
    ts_fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in m["ts"] else "%Y-%m-%d %H:%M:%S"
    return LogLine(m["kind"], datetime.strptime(m["ts"], ts_fmt), m["ranks"].split(), fields)


def parse_lines(lines: Iterable[str]) -> list[LogLine]:
    """Parse and mark the first Decode line after each Prefill (its throughput spans the idle gap)."""
    out: list[LogLine] = []
    after_prefill = True
    for raw in lines:
        line = parse_line(raw)
        if line is None:
            continue
        if line.kind == "Prefill":
            after_prefill = True
        else:
            line.after_idle = after_prefill
            after_prefill = False
        out.append(line)
    return out


@dataclass
class DecodeSummary:
    lines: int = 0
    used_lines: int = 0
    gen_throughput_tok_s_median: float | None = None
    accept_len_median: float | None = None
    accept_rate_median: float | None = None
    graph: bool | None = None
    notes: list[str] = field(default_factory=list)


def summarize(lines: list[LogLine]) -> DecodeSummary:
    decode = [x for x in lines if x.kind == "Decode"]
    used = [x for x in decode if not x.after_idle]
    s = DecodeSummary(lines=len(decode), used_lines=len(used))
    if len(decode) > len(used):
        s.notes.append(f"dropped {len(decode) - len(used)} first-after-idle decode line(s)")

    def med(key: str) -> float | None:
        vals = [x.fields[key] for x in used if isinstance(x.fields.get(key), float)]
        return statistics.median(vals) if vals else None

    s.gen_throughput_tok_s_median = med("gen throughput (token/s)")
    s.accept_len_median = med("accept len")
    s.accept_rate_median = med("accept rate")
    graphs = [v for x in used for k, v in x.fields.items() if k.endswith(" graph") and isinstance(v, bool)]
    s.graph = all(graphs) if graphs else None
    return s


def read_log(path: Path, start_offset: int = 0) -> list[LogLine]:
    with open(path, "rb") as f:
        f.seek(start_offset)
        text = f.read().decode(errors="replace")
    return parse_lines(text.splitlines())


def read_windows(path: Path, windows: list[tuple[int, int]]) -> list[str]:
    """The log's lines inside byte windows ``(start, end)`` (the timed runs'); none when there is no log."""
    lines: list[str] = []
    if path.exists():
        with open(path, "rb") as f:
            for lo, hi in windows:
                f.seek(lo)
                lines += f.read(hi - lo).decode(errors="replace").splitlines()
    return lines
