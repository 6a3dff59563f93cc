"""SGLang 0.5.23: its own flags, and what we read back from it.

Facts (shared/reference/sglang-0.5.23.md): ``--cuda-graph-max-bs`` was removed in 0.5.20 (ambiguous
prefix, exit 2): use ``--cuda-graph-max-bs-decode``. ``--random-seed`` is always passed (otherwise a
random one is drawn). Spec numbers travel together (``engines.common_flags``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_decode.core.config import ExperimentConfig

TESTED_VERSION = "0.5.23"


def engine_flags(cfg: ExperimentConfig) -> list[str]:
    e = cfg.engine
    flags: list[str] = []
    if e.cuda_graph_max_bs_decode is not None:
        flags += ["--cuda-graph-max-bs-decode", str(e.cuda_graph_max_bs_decode)]
    if e.enable_metrics:
        flags.append("--enable-metrics")
    return flags


def installed_version() -> str | None:
    """The installed sglang's version, without importing it (the core never imports sglang)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def version_warning(v: str | None = None) -> str | None:
    v = v or installed_version()
    if v is not None and v != TESTED_VERSION:
        return (f"sglang {v} is installed; spec-decode-bench is tested against sglang {TESTED_VERSION} "
                "(flags, log lines and meta_info fields may differ)")
    return None
