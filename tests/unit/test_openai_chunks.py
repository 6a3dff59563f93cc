"""openai_api.whole_chars: a stream's delta never ends inside a UTF-8 character (byte-level tokens)."""

import pytest

from spec_decode.engines.embedded.openai_api import whole_chars

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text,cut,want",
    [
        ("abc", 3, 3),  # ASCII: all
        ("aé", 2, 1),  # é is 2 bytes: its lead alone waits
        ("aé", 3, 3),
        ("a€", 2, 1),  # € is 3 bytes
        ("a€", 3, 1),
        ("a€", 4, 4),
        ("a😀", 4, 1),  # 4 bytes
        ("a😀", 5, 5),
    ],
)
def test_a_cut_character_waits_for_its_bytes(text, cut, want):
    assert whole_chars(list(text.encode())[:cut]) == want


def test_bytes_that_never_make_a_character_are_let_through():
    assert whole_chars([0x80, 0x80, 0x80, 0x80, 0x80]) == 5
    assert whole_chars([]) == 0
