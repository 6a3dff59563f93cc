"""SGLang 0.5.23: its own flags, and what we read back from it.

Facts (shared/reference/sglang-0.5.23.md): ``--cuda-graph-max-bs`` was removed in 0.5.20 (ambiguous
prefix, exit 2): use ``--cuda-graph-max-bs-decode``. ``--random-seed`` is always passed (otherwise a
random one is drawn). Spec numbers travel together (``engines.common_flags``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_decode.core.config import ExperimentConfig

TESTED_VERSION = "0.5.23"

# What SGLang 0.5.23's launcher writes into os.environ before it spawns its ranks (which inherit it;
# the launcher's own /proc environ never shows such writes): name -> (value when unset, where).
ENV_WRITES: dict[str, tuple[str, str]] = {
    "NCCL_CUMEM_ENABLE": ("0", "srt/entrypoints/engine.py 1898-1907 (1 with --enable-symm-mem)"),
    "NCCL_NVLS_ENABLE": ("0", "srt/entrypoints/engine.py 1908-1915 (1 with --enable-nccl-nvls)"),
}
# Written with tp > 1 and CUDA graphs on (the default), unless set: parallel_hook.py 369-371, 425.
GRAPH_REGISTER = ("NCCL_GRAPH_REGISTER", "0")
# --enable-deterministic-inference with tp > 1 overwrites these, the NCCL profile's values included
# (attention_hook.py 676, 696-698; the channel count is SGLANG_DETERMINISTIC_NCCL_NCHANNELS, 8 by
# default, environ.py 1531).
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
DETERMINISTIC_WRITES = {"NCCL_ALGO": "allreduce:tree", "NCCL_MIN_NCHANNELS": "8", "NCCL_MAX_NCHANNELS": "8"}
# SGLang's PCIe-IPC all-reduce for the tp group (srt/environ.py 1539, off by default; chosen before NCCL
# for decode-sized reductions: srt/distributed/parallel_state.py 481-501, 966-975). Our config decides
# it (engine.pcie_ipc_allreduce), always passed explicitly; an inherited copy is dropped.
PCIE_IPC_ALLREDUCE = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
# Forced acceptance (srt/environ.py 527-529; srt/speculative/spec_utils.py 276-290, 530-580): the mean
# accept length (bonus included; off when < 0), how each verify's count is drawn, and what the accepted
# positions emit (fixed: token id 100; real-draft-token: the draft chain, then a target bonus). Both
# engines read these names (the embedded engine: engines/embedded/decoding.py ForcedAcceptance).
SIMULATE_ACC_LEN = "SGLANG_SIMULATE_ACC_LEN"
SIMULATE_ACC_METHOD = "SGLANG_SIMULATE_ACC_METHOD"
SIMULATE_ACC_TOKEN_MODE = "SGLANG_SIMULATE_ACC_TOKEN_MODE"


def simulate_acc_env(accept_len: float, token_mode: str, method: str = "match-expected") -> dict[str, str]:
    """The server env of a forced run; every knob explicit (SGLang's defaults are match-expected and
    fixed), so the record's server env says which semantics ran."""
    return {SIMULATE_ACC_LEN: repr(float(accept_len)), SIMULATE_ACC_METHOD: method, SIMULATE_ACC_TOKEN_MODE: token_mode}


# Flags 0.5.23 parses but nothing reads (in the wheel only srt/arg_groups/fields/schedule.py 200 and
# field_order.py 68 name it; the contract tier re-greps the installed package).
# --max-running-requests when not given and speculative decoding is on (server_args.py 1088-1093)
SPEC_MAX_RUNNING_DEFAULT = 48
DEAD_FLAGS = {"--num-continuous-decode-steps": "parsed by 0.5.23 but read by nothing (a no-op): drop it"}


def rank_nccl_env(
    profile: dict[str, str], tp_size: int, extra_args: list[str], inherited: dict[str, str] | None = None
) -> dict[str, str]:
    """The NCCL variables SGLang's ranks run with: the NCCL profile (plus inherited variables our
    server env keeps, e.g. NCCL_NVLS_ENABLE), then what the launcher writes where they are unset, then
    the deterministic-inference overwrites. The NCCL probe runs with exactly this."""
    env = {**(inherited or {}), **{k: str(v) for k, v in profile.items()}}
    for name, (value, _) in ENV_WRITES.items():
        env.setdefault(name, value)
    if tp_size > 1 and "--disable-cuda-graph" not in extra_args:
        env.setdefault(*GRAPH_REGISTER)
    if tp_size > 1 and DETERMINISTIC_FLAG in extra_args:
        env.update(DETERMINISTIC_WRITES)
    return env


def engine_flags(cfg: ExperimentConfig) -> list[str]:
    e = cfg.engine
    flags: list[str] = []
    if e.cuda_graph_max_bs_decode is not None:
        flags += ["--cuda-graph-max-bs-decode", str(e.cuda_graph_max_bs_decode)]
    if e.max_running_requests is not None:
        flags += ["--max-running-requests", str(e.max_running_requests)]
    if e.enable_metrics:
        flags.append("--enable-metrics")
    if cfg.model.trust_remote_code and "--trust-remote-code" not in e.extra_args:
        flags.append("--trust-remote-code")
    return flags


def installed_version() -> str | None:
    """The installed sglang's version, without importing it (the core never imports sglang)."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def version_warning(v: str | None = None) -> str | None:
    v = v or installed_version()
    if v is not None and v != TESTED_VERSION:
        return (
            f"sglang {v} is installed; spec-decode-bench is tested against sglang {TESTED_VERSION} "
            "(flags, log lines and meta_info fields may differ)"
        )
    return None


def config_warnings(cfg: ExperimentConfig, environ: dict[str, str]) -> list[str]:
    """What preflight says about this job's SGLang choices (never silent): dead flags in
    engine.extra_args, an inherited PCIe-IPC all-reduce switch (dropped: the config decides)."""
    out = [
        f"engine.extra_args has {flag}: {why}"
        for flag, why in DEAD_FLAGS.items()
        if any(a == flag or a.startswith(flag + "=") for a in cfg.engine.extra_args)
    ]
    if PCIE_IPC_ALLREDUCE in environ:
        chosen = "1" if getattr(cfg.engine, "pcie_ipc_allreduce", False) else "0"
        out.append(
            f"{PCIE_IPC_ALLREDUCE}={environ[PCIE_IPC_ALLREDUCE]} in this shell is dropped from the server's "
            f"environment: engine.pcie_ipc_allreduce decides which all-reduce runs (this job: "
            f"{PCIE_IPC_ALLREDUCE}={chosen}, recorded in server_env)"
        )
    return out
