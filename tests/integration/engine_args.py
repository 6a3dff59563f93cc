"""The embedded engine as the integration tests start it by hand: its command, the EAGLE-3 flags in
SGLang's names, a real server process on a free port, and the tiny model pair loaded in process. One
place, so that a flag renamed in the engine is renamed once here."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.server_process import ServerProcess, free_port

from ..conftest import DRAFTER, TARGET

ENGINE = [sys.executable, "-m", "spec_decode.engines.embedded"]


def spec_flags(steps: int = 3, drafter: Path | str = DRAFTER) -> list[str]:
    """EAGLE-3 with ``steps`` draft steps, top-k 1 and steps + 1 draft tokens (a chain, as our runs)."""
    return [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(drafter),
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(steps + 1),
    ]


def embedded_server(
    log_path: Path, *flags: str, env: dict[str, str] | None = None, startup_timeout_s: float = 120
) -> ServerProcess:
    """The tiny target served on a free port with ``flags`` (not started: ``with`` it, or ``.start()``)."""
    port = free_port()
    argv = [*ENGINE, "--model-path", str(TARGET), *flags, "--port", str(port)]
    return ServerProcess(
        argv, env=env or {}, log_path=log_path, host="127.0.0.1", port=port, startup_timeout_s=startup_timeout_s
    )


def tiny_models(threads: int):
    """(target, drafter) of models/tiny, in process, with torch limited to ``threads`` threads."""
    torch.set_num_threads(threads)
    target = load_target(TARGET)
    return target, load_drafter(DRAFTER, target)
