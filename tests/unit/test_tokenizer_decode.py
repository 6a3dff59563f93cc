"""The byte tokenizer's decode: bytes(ids) in C where every id is a byte, the filter otherwise -- the same text."""

from __future__ import annotations

import random

from spec_decode.engines.embedded.tokenizer import decode, encode


def reference(ids: list[int]) -> str:  # the definition: ids outside the byte range dropped
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def test_decode_is_the_byte_texts_whatever_the_ids():
    text = "def f(x):\n    return 'héllo – 世界'\n"
    assert decode(encode(text)) == text and decode([]) == ""
    assert decode([72, 300, 105, -1, 128256]) == "Hi"  # a larger vocabulary's ids: dropped, as before
    assert decode(encode("é")[:1]) == "\ufffd"  # a cut UTF-8 sequence: the replacement character
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(-3, 300) if rng.random() < 0.1 else rng.randrange(256) for _ in range(rng.randrange(60))]
        assert decode(ids) == reference(ids)
