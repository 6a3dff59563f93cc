"""Prompt sets: JSON-lines files, one prompt object per line.

    {"text": "...", "category": "code"}          the prompt and, optionally, its category
    {"turns": ["...", ...], "category": "math"}  MT-Bench / Spec-Bench ``question.jsonl`` lines: the
                                                 first turn is the prompt (one request, no chat turns)

Other keys (``id``, ``question_id``, ...) are ignored. A line without ``category`` counts as
``uncategorized``. Categories become metric names (``category_<name>_accept_len``), so they are
letters, digits, ``_`` and ``-``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

UNCATEGORIZED = "uncategorized"
_CATEGORY = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


@dataclass(frozen=True)
class Prompt:
    index: int  # position in the file's prompts (blank lines do not count)
    text: str
    category: str = UNCATEGORIZED


def load_prompt_set(path: Path) -> list[Prompt]:
    """Every prompt of the file with its category; ValueError naming ``file:line`` for a bad line."""
    out: list[Prompt] = []
    for i, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not a JSON line ({e.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f'{path}:{i}: each line needs a "text" string')
        text = item.get("text")
        if text is None and isinstance(item.get("turns"), list) and item["turns"]:
            text = item["turns"][0]
        if not isinstance(text, str) or not text:
            raise ValueError(f'{path}:{i}: each line needs a "text" string (or MT-Bench\'s "turns" list)')
        category = item.get("category", UNCATEGORIZED)
        if not isinstance(category, str) or not _CATEGORY.match(category):
            raise ValueError(
                f'{path}:{i}: "category" must be 1-40 letters, digits, _ or - (it names '
                f"metrics such as category_<name>_accept_len); got {category!r:.60}"
            )
        out.append(Prompt(len(out), text, category))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def load_prompts(path: Path) -> list[str]:
    """The prompt texts of a set, in file order."""
    return [p.text for p in load_prompt_set(path)]
