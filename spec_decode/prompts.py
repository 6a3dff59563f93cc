"""The benchmark's prompt set: a JSON-lines file, one ``{"text": ...}`` object per line."""

from __future__ import annotations

import json
from pathlib import Path


def load_prompts(path: Path) -> list[str]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not a JSON line ({e.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise ValueError(f"{path}:{i}: each line needs a \"text\" string")
        out.append(item["text"])
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out
