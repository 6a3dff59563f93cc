"""Byte-level tokenizer: token id == byte value (vocab 256), no download, no tokenizer package.

We also write Hugging Face tokenizer files (a byte-level BPE with no merges, whose ids equal the byte
values) so that `transformers`/SGLang load the target directory as an ordinary HF model.
"""

from __future__ import annotations

import json
from pathlib import Path


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """The text of ``ids`` (ids outside the byte range are dropped: a synthetic model's larger vocabulary).
    ``bytes(ids)`` converts a list of byte values in C; the filter runs only when one is out of range: a
    streamed request decodes its whole output at every event (SGLang's cumulative text): through the filter
    that was a third of the front's CPU under streamed load (docs/benchmarks.md, benchmarks/server_cpu.py)."""
    try:
        return bytes(ids).decode("utf-8", errors="replace")
    except (ValueError, TypeError):
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-unicode table, used by the ByteLevel pre-tokenizer.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer_files(model_dir: Path, max_len: int) -> None:
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    (model_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, sort_keys=True))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
