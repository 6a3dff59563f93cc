"""The embedded engine's own flags (beyond the shared SGLang ones)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_decode.core.config import ExperimentConfig


def engine_flags(cfg: ExperimentConfig) -> list[str]:
    e = cfg.engine
    flags = ["--device", cfg.hardware.device, "--max-running-requests", str(e.max_running_requests)]
    if e.disable_overlap_schedule:
        flags.append("--disable-overlap-schedule")
    if e.cuda_eager_batching and cfg.hardware.device == "cuda":
        flags.append("--cuda-eager-batching")
    if e.cuda_graph_max_bs_decode is not None:
        flags += ["--cuda-graph-max-bs-decode", str(e.cuda_graph_max_bs_decode)]
    if e.torch_compile:
        flags.append("--enable-torch-compile")
    if e.proj_split > 1:
        flags += ["--proj-split", str(e.proj_split)]
    return flags
