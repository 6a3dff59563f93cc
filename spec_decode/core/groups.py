"""The groups an engine's limits read (``EngineConfig.check``): hardware and spec, with their own rules.

They sit below both ``core.config`` (the experiment that holds them) and ``core.engine_config`` (the
engines' schemas that check them), so that neither imports the other back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from spec_decode.core.errors import ConfigError

# spec.simulate_token_mode: SGLang 0.5.23's SGLANG_SIMULATE_ACC_TOKEN_MODE values (srt/environ.py 529,
# default fixed; checked in srt/speculative/spec_utils.py check_simulate_acc_token_mode)
SIMULATE_TOKEN_MODES = ("fixed", "real-draft-token")


@dataclass
class HardwareConfig:
    name: str = MISSING
    device: str = "cpu"  # cpu | cuda
    gpu_type: Optional[str] = None
    num_gpus: int = 0
    interconnect: str = "none"  # none | pcie | nvlink
    tp_size: int = 1
    # Jobs that may run their servers at once on this machine (CPU profiles; on GPUs the GPU count
    # decides: each job takes tp_size GPUs). The pool lives in slots_dir, shared by every sweep.
    parallel_jobs: int = 1
    slots_dir: str = "${oc.env:SPEC_DECODE_SLOTS_DIR,/tmp/spec_decode_slots}"  # the variable: e.g. a test run's own

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"hardware.device={self.device!r}: use cpu or cuda")
        if self.tp_size < 1:
            raise ConfigError(f"hardware.tp_size={self.tp_size}: must be >= 1")
        if self.parallel_jobs < 1:
            raise ConfigError(f"hardware.parallel_jobs={self.parallel_jobs}: must be >= 1")
        if self.device == "cuda" and self.tp_size > self.num_gpus:
            raise ConfigError(
                f"hardware.tp_size={self.tp_size} is larger than hardware.num_gpus={self.num_gpus} "
                f"of hardware={self.name}: lower hardware.tp_size or pick another hardware profile"
            )


@dataclass
class SpecConfig:
    steps: int = 2
    topk: int = 1
    # Derived: SGLang forces steps + 1 when topk == 1; set it only for topk > 1.
    num_draft_tokens: Optional[int] = None
    # Forced acceptance for performance work (SGLang's SGLANG_SIMULATE_ACC_LEN, same semantics on both
    # engines): every verify commits floor(x) or floor(x)+1 tokens, bonus included, mean x, whatever the
    # target says -- so the system's cost at a chosen accept length is measured without a drafter that
    # reaches it. Outputs are NOT lossless: the record is labelled performance-only. null = off.
    simulate_accept_len: Optional[float] = None
    # What a forced verify commits (SGLANG_SIMULATE_ACC_TOKEN_MODE): fixed = token id 100 everywhere
    # (SGLang 0.5.23's default); real-draft-token = the draft tokens, then the target's bonus (what the
    # cross-engine benchmarks run, so that the drafter's next inputs are its own tokens).
    simulate_token_mode: str = "fixed"
    # Take simulate_accept_len from a committed table (conf/accept_len/<name>.yaml) at spec.steps.
    simulate_accept_table: Optional[str] = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"spec.steps={self.steps}: must be >= 1 (use drafter=none for the baseline)")
        if self.simulate_token_mode not in SIMULATE_TOKEN_MODES:
            raise ConfigError(
                f"spec.simulate_token_mode={self.simulate_token_mode!r}: use one of "
                f"{', '.join(SIMULATE_TOKEN_MODES)} (SGLANG_SIMULATE_ACC_TOKEN_MODE)"
            )
        x = self.simulate_accept_len
        if x is not None and not (math.isfinite(x) and 1.0 <= x <= self.steps + 1):
            raise ConfigError(
                f"spec.simulate_accept_len={x}: must be in [1, spec.steps+1] = [1, {self.steps + 1}] (tokens "
                "committed per verify, bonus included; SGLang clamps other values into that range, so the "
                "label would not be true), or null for real acceptance"
            )
        if self.topk < 1:
            raise ConfigError(f"spec.topk={self.topk}: must be >= 1")
        if self.topk == 1:
            if self.num_draft_tokens not in (None, self.steps + 1):
                raise ConfigError(
                    f"spec.num_draft_tokens={self.num_draft_tokens} disagrees with spec.steps={self.steps}: "
                    "with spec.topk=1 it is always steps+1 (SGLang forces it); leave it unset"
                )
            self.num_draft_tokens = self.steps + 1
        elif self.num_draft_tokens is None:
            raise ConfigError(f"spec.topk={self.topk} > 1 needs spec.num_draft_tokens (the tree size)")
        elif not 2 <= self.num_draft_tokens <= self.steps * self.topk + 1:
            raise ConfigError(
                f"spec.num_draft_tokens={self.num_draft_tokens} must be in 2..steps*topk+1 "
                f"= {self.steps * self.topk + 1}"
            )
