"""Tensor parallelism of the target: which shard this process holds, and a reduction whose result
does not depend on the tp size, so greedy output at tp=N equals tp=1 bit for bit.

Megatron sharding over *units*: the target's heads and MLP columns are cut into ``units = gcd(heads,
kv_heads, intermediate_size)`` equal slices (8 for 8 heads of 24 and 512 MLP columns); rank r of N
holds units ``[r*units/N, (r+1)*units/N)``. Every sharded product is computed per unit as a batched
matmul (one matrix per unit), whose per-unit result is the same whatever the batch holds (checked on
this CPU at 1 and 2 threads; ``test_engine_tp`` asserts bit-equal logits). The row-parallel outputs
(o_proj, down_proj) are per-unit partial sums of shape (units, T, hidden), added in a fixed tree:

- tp 1: ``pairs(first half) + pairs(second half)``, no communication;
- tp 2: each rank sums its half with ``pairs`` and one ``all_reduce`` adds the two: ``a + b`` is
  commutative and exact for two operands, so this is SGLang's pattern (one all-reduce of
  (T, hidden) per block) and still equals tp 1 bit for bit;
- tp > 2: an all-reduce of more than two operands adds them in an order the backend chooses, so each
  rank writes its unit partials into its own slots of a zero (units, T, hidden) buffer; the
  all-reduce then only adds zeros (exact in any order) and every rank sums the full buffer with the
  tp-1 tree. One all-reduce per block still, of ``units`` times the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# the sharding rule without torch (the front checks --tp-size with it); re-exported, its old home
from spec_decode.engines.embedded.server_args import shard_units, tp_size_error  # noqa: F401


def pair_sum(parts: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0 by adding neighbours level by level ((p0+p1)+(p2+p3)...): elementwise adds
    only, so the result is fixed by the input's values alone (not by threads or shapes)."""
    while parts.shape[0] > 1:
        n = parts.shape[0]
        summed = parts[0 : n - 1 : 2] + parts[1:n:2]
        parts = summed if n % 2 == 0 else torch.cat([summed, parts[n - 1 :]])
    return parts[0]


def tree_sum(parts: torch.Tensor) -> torch.Tensor:
    """The reference order for all ``units`` partials: the two halves summed apart, then added
    (so that tp 2, one half per rank, reproduces it with a single two-operand all-reduce)."""
    n = parts.shape[0]
    if n & (n - 1) == 0:
        # A power of two: pair_sum over all of them adds in exactly this order (its last level adds
        # the two halves' sums) in log2(n) kernels instead of 2 (log2(n) - 1) + 1 -- on a GPU each
        # is a launch (8 units: 3 instead of 5, twice per layer).
        return pair_sum(parts)
    if n % 2:
        return pair_sum(parts)
    return pair_sum(parts[: n // 2]) + pair_sum(parts[n // 2 :])


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the group: ``size`` ranks, this one ``rank``, ``units`` slices."""

    size: int = 1
    rank: int = 0
    units: int = 1

    def __post_init__(self) -> None:
        if self.units % self.size:
            raise ValueError(f"tp size {self.size} does not divide the {self.units} shard units")

    @property
    def local_units(self) -> tuple[int, int]:
        per = self.units // self.size
        return self.rank * per, (self.rank + 1) * per

    def reduce(self, partials: torch.Tensor) -> torch.Tensor:
        """(local units, T, h) row-parallel partials -> (T, h), identical on every rank and for
        every tp size."""
        if self.size == 1:
            return tree_sum(partials)
        if self.size == 2:
            half = pair_sum(partials)
            dist.all_reduce(half)
            return half
        full = partials.new_zeros((self.units, *partials.shape[1:]))
        lo, hi = self.local_units
        full[lo:hi] = partials
        dist.all_reduce(full)
        return tree_sum(full)
