"""Batch-size buckets of the embedded engine's CUDA graphs (issue 28), pure code (no torch).

SGLang captures one decode graph per batch size of its ``cuda_graph_bs`` list, up to
``--cuda-graph-max-bs-decode``, and pads a running batch up to the next captured size
(``model_executor/cuda_graph_runner.py``: ``bisect_left(capture_bs, raw_bs)``, the padded rows
compute on dummy inputs and are dropped). The embedded engine's static path (graphs.StaticRunner)
does the same with its own list: 1, 2, 4, 8, then every 8 up to the cap (the cap itself always
included); a batch above the largest runs the same shapes eagerly.
"""

from __future__ import annotations

import bisect


def capture_bs(max_bs: int) -> list[int]:
    """The batch sizes to capture for ``--cuda-graph-max-bs-decode`` = ``max_bs`` (>= 1), ascending."""
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs-decode must be >= 1 (got {max_bs})")
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def bucket(n: int, sizes: list[int]) -> int | None:
    """The captured size a batch of ``n`` requests runs in (the smallest >= n); None above the largest
    (that batch runs eagerly)."""
    if n < 1:
        raise ValueError(f"a batch has at least one request (got {n})")
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def padding(n: int, sizes: list[int]) -> int:
    """Dummy rows added to a batch of ``n`` to reach its bucket (0 when it runs eagerly)."""
    b = bucket(n, sizes)
    return 0 if b is None else b - n
