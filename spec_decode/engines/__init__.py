"""Server command lines from the typed config (DESIGN 3.1).

Both engines take the same SGLang flags for what they share; each adds its own. The baseline has no
speculative flag at all; with a drafter the three spec numbers always travel together.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from spec_decode.engines import sglang
from spec_decode.engines.engine import engine_of

if TYPE_CHECKING:  # the embedded engine imports this package on GPU boxes without Hydra
    from spec_decode.core.config import ExperimentConfig


def launcher(cfg: ExperimentConfig) -> list[str]:
    argv = list(cfg.engine.launcher)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the interpreter that runs us, with our venv
    return argv


def common_flags(cfg: ExperimentConfig, port: int) -> list[str]:
    e = cfg.engine
    flags = ["--model-path", cfg.model.path]
    if cfg.speculative:
        s = cfg.spec
        flags += [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(cfg.drafter.path),
            "--speculative-num-steps",
            str(s.steps),
            "--speculative-eagle-topk",
            str(s.topk),
            "--speculative-num-draft-tokens",
            str(s.num_draft_tokens),
        ]
    flags += [
        "--host",
        e.host,
        "--port",
        str(port),
        "--random-seed",
        str(e.random_seed),
        "--tp-size",
        str(cfg.hardware.tp_size),
        "--decode-log-interval",
        str(e.decode_log_interval),
    ]
    return flags


def server_command(cfg: ExperimentConfig, port: int) -> list[str]:
    flags = engine_of(cfg).engine_flags(cfg)
    return launcher(cfg) + common_flags(cfg, port) + flags + list(cfg.engine.extra_args)


def server_extra_env(cfg: ExperimentConfig, profile_path: str | None) -> dict[str, str]:
    """What the server's environment gets on top of ours: NCCL profile, engine env, profiler, forced
    acceptance (spec.simulate_accept_len, speculative jobs only), and no network at run time (nothing
    may download a model)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    forced = cfg.spec.simulate_accept_len if cfg.speculative else None
    simulated = sglang.simulate_acc_env(forced, cfg.spec.simulate_token_mode) if forced is not None else {}
    method = sglang.SIMULATE_ACC_METHOD
    if method in cfg.engine.env and simulated:  # the method may be picked through engine.env
        simulated[method] = str(cfg.engine.env[method])
    env.update({k: str(v) for k, v in cfg.engine.env.items()})
    env.update(simulated)
    env.update({k: str(v) for k, v in cfg.nccl.env.items()})
    env.update(engine_of(cfg).server_env(cfg))  # SGLang: which all-reduce runs, the config's, never inherited
    if profile_path and cfg.speculative:
        env["SPEC_DECODE_PROFILE"] = profile_path
        # The runner's on/off switch (spec_decode/profiler/switch.py): dormant in the timed runs.
        env["SPEC_DECODE_PROFILE_SWITCH"] = f"{profile_path}.switch"
    return env


def rank_nccl_env(cfg: ExperimentConfig) -> dict[str, str]:
    """The NCCL variables the server's ranks run with -- what the NCCL probe runs with: the server's
    environment as ServerProcess builds it (profile + kept inherited ones), plus, on SGLang, what its
    launcher writes before it spawns the ranks (spec_decode.engines.sglang.rank_nccl_env)."""
    # lazy, as in start_server: the embedded engine imports this package where psutil and requests are absent
    from spec_decode.engines.server_process import server_env

    env = {k: v for k, v in server_env(server_extra_env(cfg, None)).items() if k.startswith("NCCL_")}
    return engine_of(cfg).rank_nccl_env(env, cfg)


def _pin_launcher(pid: int, cpus: set[int]) -> None:
    """The launcher's main thread on ``cpus`` right after the spawn; one that died already is the health
    loop's to report (with its log), not this call's."""
    with contextlib.suppress(ProcessLookupError):
        os.sched_setaffinity(pid, cpus)


def start_server(
    cfg: ExperimentConfig,
    extra_env: dict[str, str],
    log_path: Path,
    attempts: int = 3,
    any_port: bool = False,
    cpus: set[int] | None = None,
):
    """Start the engine's server on the configured port (any free one with ``any_port``: a paired
    baseline beside the spec server), or a free one when it is taken (also when another sweep takes it
    between our check and the server's bind). ``cpus`` (benchmark.server_cpus): the launcher's cores from
    the moment it is spawned, so every thread and process it starts inherits them (the runner pins the whole
    tree again once it is up). Returns the started ``server.ServerProcess``."""
    # lazy, as in rank_nccl_env: the embedded engine imports this package where psutil and requests are absent
    from spec_decode.engines.server_process import PortTaken, ServerError, ServerProcess, choose_port

    wanted = 0 if any_port else cfg.engine.port
    for attempt in range(attempts):
        port = choose_port(cfg.engine.host, wanted if attempt == 0 else 0)
        srv = ServerProcess(
            server_command(cfg, port),
            env=extra_env,
            log_path=log_path,
            host=cfg.engine.host,
            port=port,
            startup_timeout_s=cfg.engine.startup_timeout_s,
            shutdown_grace_s=cfg.engine.shutdown_grace_s,
            health_path=engine_of(cfg).health_path,
            on_spawn=functools.partial(_pin_launcher, cpus=cpus) if cpus else None,
        )
        try:
            return srv.start()
        except PortTaken:
            continue
    raise ServerError(f"could not get a free port for the server after {attempts} attempts")
