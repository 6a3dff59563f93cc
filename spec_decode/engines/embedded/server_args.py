"""The embedded engine's settings and the rules on them, without torch (as SGLang's ``server_args.py``): the
front checks them before any rank exists, so the front never imports torch; the ranks use the same ones.

- :class:`RankSpec`: what every rank process is started with;
- :class:`SimulatedAcceptance`: forced acceptance as the environment sets it (``SGLANG_SIMULATE_ACC_*``,
  SGLang 0.5.23's names and rules); decoding.ForcedAcceptance draws with it on the ranks;
- :func:`tp_size_error` / :func:`shard_units`: which ``--tp-size`` shards the target (parallel.py shards);
- :func:`max_new_tokens`: the context room a request may fill (request.py checks, decoding.py decodes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from spec_decode.engines.sglang import SIMULATE_ACC_LEN, SIMULATE_ACC_METHOD, SIMULATE_ACC_TOKEN_MODE

SIMULATE_METHODS = ("match-expected", "multinomial")
SIMULATE_TOKEN_MODES = ("fixed", "real-draft-token")


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to start (picklable: it travels to the spawned processes)."""

    model_path: str
    draft_model_path: str | None
    steps: int
    tp_size: int
    device: str
    cpu_threads: int
    random_seed: int | None
    decode_log_interval: int
    log_level: str
    dist_port: int
    front_pid: int
    disable_cuda_graph: bool = False  # on CUDA: run the static shapes eagerly (SGLang's flag)
    max_running_requests: int = 16  # SGLang's --max-running-requests: the rest wait in the queue
    disable_overlap_schedule: bool = False  # SGLang's flag: process each result before the next launch
    cuda_eager_batching: bool = False  # on CUDA: the packed eager path (batches) instead of the static one
    cuda_graph_max_bs: int | None = None  # --cuda-graph-max-bs-decode; None: --max-running-requests
    static_path: bool = False  # on CPU: the static path's shapes, eagerly (--static-path: tests and debugging)
    torch_compile: bool = False  # on CUDA: the static shapes through torch.compile (--enable-torch-compile)
    proj_split: int = 0  # with torch_compile: o/down as that many fp32 partials (--proj-split; StaticRunner's)


@dataclass(frozen=True)
class SimulatedAcceptance:
    """SGLang 0.5.23's forced-acceptance settings: the mean tokens a verify commits, bonus included
    (``accept_len``, SGLANG_SIMULATE_ACC_LEN), how each count is drawn (``method``) and what the
    committed positions hold (``token_mode``). A bad value is a ValueError naming the variable."""

    accept_len: float
    method: str = "match-expected"
    token_mode: str = "fixed"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.accept_len) and self.accept_len > 0):
            raise ValueError(f"{SIMULATE_ACC_LEN}={self.accept_len}: must be a number > 0")
        if self.method not in SIMULATE_METHODS:
            raise ValueError(f"{SIMULATE_ACC_METHOD}={self.method!r}: expected one of {', '.join(SIMULATE_METHODS)}")
        if self.token_mode not in SIMULATE_TOKEN_MODES:
            raise ValueError(f"{SIMULATE_ACC_TOKEN_MODE}={self.token_mode!r}: expected 'fixed' or 'real-draft-token'")

    @classmethod
    def from_env(cls, env=os.environ) -> SimulatedAcceptance | None:
        """None unless SGLANG_SIMULATE_ACC_LEN is set > 0 (SGLang: "turn off if < 0"; default -1)."""
        raw = env.get(SIMULATE_ACC_LEN, "").strip()
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{SIMULATE_ACC_LEN}={raw!r}: not a number") from None
        if not value > 0:
            return None
        return cls(value, env.get(SIMULATE_ACC_METHOD, "match-expected"), env.get(SIMULATE_ACC_TOKEN_MODE, "fixed"))

    def describe(self) -> str:
        return (
            f"forced acceptance: {SIMULATE_ACC_LEN}={self.accept_len} method={self.method} "
            f"token_mode={self.token_mode} (performance-only: outputs are not lossless)"
        )


def shard_units(num_attention_heads: int, num_key_value_heads: int, intermediate_size: int) -> int:
    """How many equal slices the sharded dimensions are cut into; every valid tp size divides it."""
    return math.gcd(num_attention_heads, num_key_value_heads, intermediate_size)


def tp_size_error(
    tp_size: int, num_attention_heads: int, num_key_value_heads: int, intermediate_size: int
) -> str | None:
    """Why ``--tp-size`` cannot shard this target (None if it can)."""
    units = shard_units(num_attention_heads, num_key_value_heads, intermediate_size)
    valid = [d for d in range(1, units + 1) if units % d == 0]
    if tp_size >= 1 and units % tp_size == 0:
        return None
    return (
        f"--tp-size {tp_size}: must be >= 1 and divide the target's num_attention_heads "
        f"({num_attention_heads}), num_key_value_heads ({num_key_value_heads}) and "
        f"intermediate_size ({intermediate_size}); valid sizes: {', '.join(map(str, valid))}"
    )


def max_new_tokens(context: int, steps: int, prompt_len: int) -> int:
    """The longest generation that fits the context (the last cycle may overshoot by steps + 1)."""
    return context - prompt_len - steps - 1
