"""SGLang 0.5.23 and 0.5.17 (``SUPPORTED``): their own flags, and what we read back from them.

Facts (shared/reference/sglang-0.5.23.md): ``--cuda-graph-max-bs`` is refused by the parser of both
supported releases (ambiguous prefix, exit 2): use ``--cuda-graph-max-bs-decode``. ``--random-seed`` is
always passed (otherwise a random one is drawn). Spec numbers travel together (``engines.common_flags``).
Any other installed release is refused by preflight (``version_error``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_decode.core.config import ExperimentConfig


@dataclass(frozen=True)
class SGLangRelease:
    """What one supported SGLang release does where our adapter touches it. Every value is read from that
    release's wheel (paths under ``sglang/srt/``, file:line); the contract tier re-reads each row from
    both installed sources (tests/contract/test_sglang_versions.py)."""

    version: str
    # The decode CUDA-graph cap flag we pass, and flags the parser refuses (exit 2).
    graph_cap_flag: str
    refused_flags: tuple[str, ...]
    # ``Decode batch, #running-req: ..., accept len: x, accept rate: y, cuda graph: b, gen throughput
    # (token/s): z, #queue-req: n`` (parsers.decode_log reads both); where the line is built.
    decode_log_at: str
    # Every speculative key the release puts into meta_info (tokenizer_manager.py); we read META_INFO_KEYS.
    meta_info_spec_keys: frozenset[str]
    # The worker EAGLE/EAGLE3 runs (our profiler's hook targets live in its module) and where it is chosen.
    spec_worker: str
    # The overlap scheduler is on unless --disable-overlap-schedule (the field's default).
    overlap_default_on: bool
    # Forced-acceptance env names (environ.py).
    simulate_acc_env: tuple[str, str, str]
    # name -> (value when unset, where): what the launcher writes before spawning the ranks.
    env_writes: dict[str, tuple[str, str]]
    # Written by the launcher on every launch (engine.py): a fresh id, never the same twice.
    run_id_env: tuple[str, str]
    # (name, value) written with tp > 1 and CUDA graphs on, unless set; None where the release has none.
    graph_register: tuple[str, str] | None
    # --enable-deterministic-inference with tp > 1 overwrites these.
    deterministic_writes: dict[str, str]
    # SGLang's PCIe-IPC all-reduce env switch; None where the release has none (engine.pcie_ipc_allreduce
    # then has nothing to switch).
    pcie_ipc_allreduce: str | None


# meta_info keys the client reads (runner/client.py); every supported release must write them.
META_INFO_KEYS = (
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
)
_SIMULATE = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD", "SGLANG_SIMULATE_ACC_TOKEN_MODE")
_SPEC_KEYS = {
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_cap_length",
    "spec_block_accept_length",
    "spec_correct_drafts_histogram",
    "spec_cap_lens_histogram",
}

SUPPORTED: dict[str, SGLangRelease] = {
    "0.5.23": SGLangRelease(
        version="0.5.23",
        graph_cap_flag="--cuda-graph-max-bs-decode",  # arg_groups/fields/exec_.py 629
        refused_flags=("--cuda-graph-max-bs",),  # removed in 0.5.20: ambiguous prefix, exit 2
        decode_log_at="managers/scheduler_components/metrics_reporter.py 963, 1005, 1038-1042",
        meta_info_spec_keys=frozenset(_SPEC_KEYS),  # managers/tokenizer_manager.py 3164-3207
        spec_worker="speculative.eagle_worker_v2.EAGLEWorkerV2",  # speculative/spec_info.py 352-364
        overlap_default_on=True,  # arg_groups/fields/schedule.py 193-199
        simulate_acc_env=_SIMULATE,  # environ.py 527-529
        env_writes={
            "NCCL_CUMEM_ENABLE": ("0", "srt/entrypoints/engine.py 1898-1907 (1 with --enable-symm-mem)"),
            "NCCL_NVLS_ENABLE": ("0", "srt/entrypoints/engine.py 1908-1915 (1 with --enable-nccl-nvls)"),
        },
        run_id_env=("SGLANG_RUN_ID", "srt/entrypoints/engine.py 1936-1938"),
        graph_register=("NCCL_GRAPH_REGISTER", "0"),  # arg_groups/parallel_hook.py 369-371, 425
        # arg_groups/attention_hook.py 676, 696-698; the channel count: environ.py 1531
        deterministic_writes={"NCCL_ALGO": "allreduce:tree", "NCCL_MIN_NCHANNELS": "8", "NCCL_MAX_NCHANNELS": "8"},
        pcie_ipc_allreduce="SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",  # environ.py 1539
    ),
    # The release that runs on the lent H200 (cp312, pins torch 2.11); first real run 2026-12-04.
    "0.5.17": SGLangRelease(
        version="0.5.17",
        # server_args.py 1823; the parser of prepare_server_args refuses --cuda-graph-max-bs as an
        # ambiguous prefix (exit 2): its deprecated alias (server_args.py 8315-8321) is not on that parser
        graph_cap_flag="--cuda-graph-max-bs-decode",
        refused_flags=("--cuda-graph-max-bs",),
        decode_log_at="managers/scheduler_components/metrics_reporter.py 757, 798, 833-836",
        # managers/tokenizer_manager.py 2765-2816: also the older names of three of them
        meta_info_spec_keys=frozenset(
            _SPEC_KEYS | {"spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"}
        ),
        spec_worker="speculative.eagle_worker_v2.EAGLEWorkerV2",  # speculative/spec_info.py 286-298
        overlap_default_on=True,  # server_args.py 949-956
        simulate_acc_env=_SIMULATE,  # environ.py 347-349
        env_writes={
            "NCCL_CUMEM_ENABLE": ("0", "srt/entrypoints/engine.py 1582-1583 (1 with --enable-symm-mem)"),
            "NCCL_NVLS_ENABLE": ("0", "srt/entrypoints/engine.py 1584-1591 (1 with --enable-nccl-nvls)"),
        },
        run_id_env=("SGLANG_RUN_ID", "srt/entrypoints/engine.py 1613-1615"),
        graph_register=None,  # no NCCL_GRAPH_REGISTER anywhere in 0.5.17
        deterministic_writes={"NCCL_ALGO": "allreduce:tree"},  # server_args.py 7881; no channel writes
        pcie_ipc_allreduce=None,  # no SGLANG_ENABLE_PCIE_IPC_ALLREDUCE in 0.5.17
    ),
}
# The newest supported release: what `pip install -e '.[sglang]'` installs (pyproject's extra).
TESTED_VERSION = "0.5.23"
# What a refusal tells the user to do (each release pins its torch; their wheels differ in Python).
INSTALL_SUPPORTED = (
    f"pip install -e '.[sglang]' (sglang {TESTED_VERSION}: Python 3.11, torch 2.14.1), or pip install "
    "sglang==0.5.17 (Python 3.12, torch 2.11: the lent H200's)"
)

# 0.5.23's rows under their old names (callers predate the table): the launcher's env writes (its ranks
# inherit them; the launcher's own /proc environ never shows such writes), the graph-register write, the
# deterministic-inference overwrites (the NCCL profile's values included).
ENV_WRITES: dict[str, tuple[str, str]] = SUPPORTED[TESTED_VERSION].env_writes
GRAPH_REGISTER: tuple[str, str] = SUPPORTED[TESTED_VERSION].graph_register or ("NCCL_GRAPH_REGISTER", "0")
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
DETERMINISTIC_WRITES = SUPPORTED[TESTED_VERSION].deterministic_writes
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
    profile: dict[str, str],
    tp_size: int,
    extra_args: list[str],
    inherited: dict[str, str] | None = None,
    release: str | None = None,
) -> dict[str, str]:
    """The NCCL variables SGLang's ranks run with: the NCCL profile (plus inherited variables our
    server env keeps, e.g. NCCL_NVLS_ENABLE), then what the launcher writes where they are unset, then
    the deterministic-inference overwrites. The NCCL probe runs with exactly this. ``release``: whose
    writes (default: the installed supported release, else the tested one)."""
    rel = SUPPORTED.get(release or installed_version() or TESTED_VERSION) or SUPPORTED[TESTED_VERSION]
    env = {**(inherited or {}), **{k: str(v) for k, v in profile.items()}}
    for name, (value, _) in rel.env_writes.items():
        env.setdefault(name, value)
    if tp_size > 1 and "--disable-cuda-graph" not in extra_args and rel.graph_register is not None:
        env.setdefault(*rel.graph_register)
    if tp_size > 1 and DETERMINISTIC_FLAG in extra_args:
        env.update(rel.deterministic_writes)
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


def supported_release(v: str | None = None) -> SGLangRelease | None:
    """The table's row for ``v`` (default: the installed sglang); None when absent or unsupported."""
    v = v or installed_version()
    return SUPPORTED.get(v) if v is not None else None


def version_error(v: str | None = None) -> str | None:
    """Why an installed sglang must not run a job (preflight refuses it); None when it is supported or
    not installed (preflight says "not installed" on its own)."""
    v = v or installed_version()
    if v is None or v in SUPPORTED:
        return None
    names = ", ".join(sorted(SUPPORTED, key=lambda x: tuple(int(p) for p in x.split("."))))
    return (
        f"engine=sglang: sglang {v} is installed; spec-decode-bench supports sglang {names} only (their flags, "
        f"decode-log lines, meta_info keys and hook targets are checked: spec_decode/engines/sglang.py "
        f"SUPPORTED); install one: {INSTALL_SUPPORTED}"
    )


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
