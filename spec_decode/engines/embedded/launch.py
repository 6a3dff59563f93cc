"""The embedded engine's own flags (beyond the shared SGLang ones)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_decode.core.config import ExperimentConfig


def engine_flags(cfg: ExperimentConfig) -> list[str]:
    return ["--device", cfg.hardware.device]
