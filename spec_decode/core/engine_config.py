"""The engines' schemas (DESIGN 3.1): what every engine takes (``EngineConfig``) and each engine's own
fields and limits, registered as ``base_<name>`` in Hydra's ConfigStore (``core.config.register_configs``).
A new engine adds its schema here and its argv builder in ``spec_decode/engines/``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from omegaconf import MISSING

from spec_decode.core.errors import ConfigError
from spec_decode.core.groups import HardwareConfig, SpecConfig

# The flags the runner passes from a config key (engines.common_flags; each engine's engine_flags adds its
# own, OWNED_FLAGS below). In engine.extra_args such a flag would override the key's value (the server's
# parser keeps the last) and the record would name a value that did not run. Aliases included.
COMMON_FLAGS: dict[str, str] = {
    "--model-path": "model.path",
    "--model": "model.path",
    "--speculative-algorithm": "drafter (EAGLE3 with a drafter, none without)",
    "--speculative-draft-model-path": "drafter.path",
    "--speculative-draft-model": "drafter.path",
    "--speculative-num-steps": "spec.steps",
    "--speculative-eagle-topk": "spec.topk",
    "--speculative-num-draft-tokens": "spec.num_draft_tokens",
    "--host": "engine.host",
    "--port": "engine.port",
    "--random-seed": "engine.random_seed",
    "--tp-size": "hardware.tp_size",
    "--tensor-parallel-size": "hardware.tp_size",
    "--decode-log-interval": "engine.decode_log_interval",
}


def owned_flag_problems(extra_args: list[str], owned: dict[str, str]) -> list[str]:
    """engine.extra_args items that set a flag a config key owns: the flag or an alias, ``--flag=v``, or a
    prefix of one (SGLang's argparse takes a unique prefix, ``--tp`` for ``--tp-size``, and refuses an
    ambiguous one; the embedded engine's parser refuses any prefix)."""
    out = []
    for i, arg in enumerate(extra_args):
        flag = str(arg).split("=", 1)[0]
        if not flag.startswith("--") or len(flag) < 4:
            continue
        if flag in owned:
            what = f"the runner sets this flag from {owned[flag]}"
        elif hits := sorted(f for f in owned if f.startswith(flag)):
            keys = " / ".join(sorted({owned[f] for f in hits}))
            what = (
                f"a prefix of {', '.join(hits)} (SGLang's parser reads a unique prefix as that flag and refuses an "
                f"ambiguous one; the embedded engine's refuses abbreviations), which the runner sets from {keys}"
            )
        else:
            continue
        out.append(
            f"engine.extra_args[{i}]={arg}: {what}; set that key instead (a second value on the command line "
            "would override the key's, and the record would name a value that did not run)"
        )
    return out


@dataclass
class EngineConfig:
    """What every engine takes (DESIGN 3.1); each engine's own schema adds its fields and limits."""

    # flag -> the key that sets it (COMMON_FLAGS plus the engine's own); refused in extra_args
    OWNED_FLAGS: ClassVar[dict[str, str]] = COMMON_FLAGS

    name: str = MISSING  # embedded | sglang
    launcher: list[str] = field(default_factory=list)  # a leading "python" means this interpreter
    host: str = "127.0.0.1"
    port: int = 30000  # replaced by a free port when taken
    random_seed: int = 0
    decode_log_interval: int = 10
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    # Stop: SIGTERM to the launcher, this long for its own drain (SGLang: ShutdownReq, 15 s, then it
    # reaps its children), then SIGKILL to the group (spec_decode/engines/server_process.py shutdown).
    shutdown_grace_s: float = 30.0
    extra_args: list[str] = field(default_factory=list)  # passed verbatim, logged
    env: dict[str, str] = field(default_factory=dict)  # extra server env (not NCCL: use nccl=)

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise ConfigError(f"engine.name={self.name!r}: use engine=embedded or engine=sglang")
        if not isinstance(self, ENGINES[self.name]):
            raise ConfigError(
                f"engine.name={self.name!r} but conf/engine/<option>.yaml does not select the "
                f"schema base_{self.name} in its defaults list"
            )
        if not self.launcher:
            raise ConfigError("engine.launcher is empty: it is the command that starts the server")
        if "SGLANG_SIMULATE_ACC_LEN" in self.env:
            raise ConfigError(
                "engine.env.SGLANG_SIMULATE_ACC_LEN: set spec.simulate_accept_len instead, so that "
                "the job passes it and labels its results performance-only"
            )
        if "SGLANG_SIMULATE_ACC_TOKEN_MODE" in self.env:
            raise ConfigError(
                "engine.env.SGLANG_SIMULATE_ACC_TOKEN_MODE: set spec.simulate_token_mode="
                "fixed|real-draft-token instead, so that the record says which mode ran"
            )
        if "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in self.env:
            raise ConfigError(
                "engine.env.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: set engine.pcie_ipc_allreduce=true|false "
                "instead (engine=sglang), so that the all-reduce choice is recorded and sweepable"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"engine.port={self.port}: must be in 0..65535")
        for key in ("startup_timeout_s", "request_timeout_s", "shutdown_grace_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"engine.{key}={getattr(self, key)}: must be > 0 seconds")
        if self.decode_log_interval < 1:
            raise ConfigError(f"engine.decode_log_interval={self.decode_log_interval}: must be >= 1")
        if problems := owned_flag_problems(list(self.extra_args), type(self).OWNED_FLAGS):
            raise ConfigError("; ".join(problems))

    def check(self, spec: SpecConfig, hardware: HardwareConfig) -> None:
        """This engine's limits on the other groups (ConfigError naming the key)."""


@dataclass
class EmbeddedEngineConfig(EngineConfig):
    """Our CPU/CUDA engine (python -m spec_decode.engines.embedded)."""

    OWNED_FLAGS: ClassVar[dict[str, str]] = {  # engines/embedded/launch.py engine_flags
        **COMMON_FLAGS,
        "--device": "hardware.device",
        "--max-running-requests": "engine.max_running_requests",
        "--disable-overlap-schedule": "engine.disable_overlap_schedule",
        "--cuda-eager-batching": "engine.cuda_eager_batching",
        "--cuda-graph-max-bs-decode": "engine.cuda_graph_max_bs_decode",
        "--enable-torch-compile": "engine.torch_compile",
        "--proj-split": "engine.proj_split",
    }

    name: str = "embedded"
    max_running_requests: int = 16  # --max-running-requests: the running batch's cap (SGLang's flag)
    disable_overlap_schedule: bool = False  # --disable-overlap-schedule (SGLang's flag; overlap is the default)
    # --cuda-eager-batching (CUDA only): decode on the packed eager path (continuous batching, no static
    # buffers, no graphs). Off: the static / CUDA-graph path (request slots, one graph per batch-size bucket).
    cuda_eager_batching: bool = False
    # --cuda-graph-max-bs-decode (SGLang 0.5.23's flag): the static path's largest graph batch size; batches
    # above it run eagerly. null = max_running_requests (its cap: SGLang's capture list stops at the pool).
    cuda_graph_max_bs_decode: Optional[int] = None
    # --enable-torch-compile (SGLang's flag name; CUDA static path only): each static shape through
    # torch.compile before capture (fused elementwise kernels; ~30 s more start-up per step count on the
    # 8B shape at one graph bucket). docs/embedded-engine.md has what it gains.
    torch_compile: bool = False
    # --proj-split (with torch_compile): o_proj and down_proj as that many fp32 partials whose sum inductor
    # reads inside the next fused norm, in place of cuBLAS's split-K reduce kernels; 0: one GEMM each.
    # Measured on an H100: the 8B-shaped decode step 0.7-0.9% faster at 4 (docs/embedded-engine.md).
    proj_split: int = 0

    def check(self, spec: SpecConfig, hardware: HardwareConfig) -> None:
        if self.proj_split < 0 or self.proj_split == 1 or (self.proj_split > 1 and not self.torch_compile):
            raise ConfigError(
                f"engine.proj_split={self.proj_split}: "
                + (
                    "must be 0 (off) or >= 2 (the number of partials; 1 would be the one GEMM)"
                    if self.proj_split < 2
                    else "the partials' sum is fused by torch.compile: set engine.torch_compile=true (the CUDA "
                    "static path at tp 1), or engine.proj_split=0"
                )
            )
        if self.torch_compile and (hardware.device != "cuda" or self.cuda_eager_batching):
            raise ConfigError(
                f"engine.torch_compile=true with hardware={hardware.name} (device {hardware.device})"
                f"{' and engine.cuda_eager_batching=true' if self.cuda_eager_batching else ''}: it compiles "
                "the CUDA static path's shapes; set it false, or use a CUDA hardware profile without "
                "cuda_eager_batching"
            )
        if self.torch_compile and hardware.tp_size > 1:
            raise ConfigError(
                f"engine.torch_compile=true with hardware.tp_size={hardware.tp_size}: the compiled shapes "
                "with NCCL all-reduces inside are not tested yet (no 2-GPU machine); use tp 1, or "
                "engine.torch_compile=false"
            )
        if self.max_running_requests < 1:
            raise ConfigError(
                f"engine.max_running_requests={self.max_running_requests}: must be >= 1 "
                "(requests decoded together; the rest queue)"
            )
        if self.cuda_graph_max_bs_decode is not None and self.cuda_graph_max_bs_decode < 1:
            raise ConfigError(
                f"engine.cuda_graph_max_bs_decode={self.cuda_graph_max_bs_decode}: must be >= 1 "
                "(or null: engine.max_running_requests)"
            )
        if spec.topk != 1:
            raise ConfigError(
                f"spec.topk={spec.topk}: engine=embedded drafts chains only (topk 1); "
                "use engine=sglang for tree drafting"
            )


@dataclass
class SglangEngineConfig(EngineConfig):
    """SGLang 0.5.23 (python -m sglang.launch_server): its own flags."""

    OWNED_FLAGS: ClassVar[dict[str, str]] = {  # engines/sglang.py engine_flags (--trust-remote-code: either)
        **COMMON_FLAGS,
        "--max-running-requests": "engine.max_running_requests",
        "--cuda-graph-max-bs-decode": "engine.cuda_graph_max_bs_decode",
        "--enable-metrics": "engine.enable_metrics",
    }

    name: str = "sglang"
    cuda_graph_max_bs_decode: Optional[int] = None  # --cuda-graph-max-bs-decode (0.5.20 removed -max-bs)
    # --max-running-requests; null = SGLang's own (48 with speculative decoding, server_args.py 1088-1093;
    # from memory without). Preflight refuses a benchmark.concurrency above it.
    max_running_requests: Optional[int] = None
    enable_metrics: bool = False  # --enable-metrics (Prometheus /metrics)
    # Which all-reduce serves decode on tp > 1: false = NCCL; true = SGLang's PCIe-IPC all-reduce
    # (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, chosen before NCCL for decode-sized reductions), always passed
    # explicitly to the server (an inherited copy is dropped); sweep it: engine.pcie_ipc_allreduce=false,true
    pcie_ipc_allreduce: bool = False

    def check(self, spec: SpecConfig, hardware: HardwareConfig) -> None:
        if hardware.device == "cpu":
            raise ConfigError(
                f"engine=sglang with hardware={hardware.name} (a CPU profile): SGLang's EAGLE-3 "
                "path needs GPUs; use a GPU hardware profile, or engine=embedded on CPU"
            )
        for key in ("max_running_requests", "cuda_graph_max_bs_decode"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"engine.{key}={value}: must be >= 1 (or null: SGLang's own choice)")


ENGINES: dict[str, type[EngineConfig]] = {"embedded": EmbeddedEngineConfig, "sglang": SglangEngineConfig}
