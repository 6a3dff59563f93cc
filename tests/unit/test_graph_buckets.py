"""Batch-size buckets for CUDA graphs (issue 28; spec_decode/engines/embedded/buckets.py): SGLang's
rule -- capture a list of sizes up to the cap, run a batch in the smallest captured size >= it,
padding the rest -- as pure code."""

import pytest

from spec_decode.engines.embedded.buckets import bucket, capture_bs, padding

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "cap,sizes",
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (4, [1, 2, 4]),
        (16, [1, 2, 4, 8, 16]),
        (20, [1, 2, 4, 8, 16, 20]),
        (32, [1, 2, 4, 8, 16, 24, 32]),
    ],
)
def test_capture_list_up_to_the_cap_always_holds_the_cap(cap, sizes):
    assert capture_bs(cap) == sizes


def test_a_batch_runs_in_the_smallest_captured_size_that_holds_it_padded():
    sizes = capture_bs(32)
    assert [bucket(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 24, 25, 32)] == [1, 2, 4, 8, 8, 16, 24, 24, 32, 32]
    assert [padding(n, sizes) for n in (3, 9, 25, 32)] == [1, 7, 7, 0]
    assert bucket(33, sizes) is None and padding(33, sizes) == 0  # above the cap: eager, nothing padded


def test_bad_sizes_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--cuda-graph-max-bs-decode must be >= 1"):
        capture_bs(0)
    with pytest.raises(ValueError, match="at least one request"):
        bucket(0, [1, 2])
