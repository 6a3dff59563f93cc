"""The engine as an object: what the harness asks of an engine, answered by each engine, so that no code
outside ``spec_decode/engines/`` branches on the engine's name (``tests/unit/test_layers.py`` checks).

One lookup: ``engine_of(cfg)`` (a job's config) or ``named(name)`` (a record's ``engine.name``). A new
engine adds a class here beside its schema in ``core/engine_config.py`` and its argv builder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

# Modules, not the package (``from spec_decode.engines import ...``): the package's __init__ imports this one.
import spec_decode.engines.embedded.launch as embedded_launch
import spec_decode.engines.sglang as sglang
from spec_decode import __version__
from spec_decode.analysis.control import CPU_NO_NCCL

if TYPE_CHECKING:  # the embedded engine imports this package on GPU boxes without Hydra
    from spec_decode.core.config import ExperimentConfig
    from spec_decode.core.groups import HardwareConfig


class Engine:
    """What every engine answers; the defaults are the embedded engine's kind (ours, in this package)."""

    name: ClassVar[str]
    # Greedy outputs equal the baseline's token for token: a divergence fails the lossless check (else it
    # only warns: the engine's kernels may not be batch-invariant).
    exact_outputs: ClassVar[bool] = True
    # A package installed beside ours: preflight and the doctor check that it is installed, its version,
    # and our profiler's hook targets, read from its source (importing it costs seconds).
    external: ClassVar[bool] = False
    package: ClassVar[str | None] = None  # its distribution and import name, when external
    # One byte a token: preflight can count a prompt's tokens, so it checks prompts against the context.
    byte_tokens: ClassVar[bool] = False
    # model.path may be a Hugging Face hub id that the server finds in the local cache.
    resolves_hub_ids: ClassVar[bool] = False
    # A batch above the CUDA-graph cap: refused by preflight (True), or a warning (the eager fallback runs).
    refuses_eager_overflow: ClassVar[bool] = False
    # Readiness: the path that answers 200 once the server serves (ServerProcess polls it).
    health_path: ClassVar[str] = "/health"
    # External engines: the releases preflight lets run (any other is refused), and how to install one.
    supported_versions: ClassVar[tuple[str, ...]] = ()
    install_hint: ClassVar[str] = ""

    def engine_flags(self, cfg: ExperimentConfig) -> list[str]:
        """The server's own flags, beyond those both engines share (``engines.common_flags``)."""
        raise NotImplementedError

    def installed_version(self) -> str | None:
        """The version that would run; None: not installed."""
        return __version__

    def version_error(self, v: str | None = None) -> str | None:
        """Why the installed version (or ``v``) must not run a job; None: it may."""
        return None

    def config_warnings(self, cfg: ExperimentConfig, environ: dict[str, str]) -> list[str]:
        """What preflight says about this job's engine choices (never silent)."""
        return []

    def default_max_running(self, speculative: bool) -> int | None:
        """The running batch's cap when engine.max_running_requests is null (None: no cap known)."""
        return None

    def decodes_with_graphs(self, cfg: ExperimentConfig) -> bool:
        """Decode batches up to engine.cuda_graph_max_bs_decode run as CUDA graphs in this job."""
        return False

    def host_stamps_na(self, cfg: ExperimentConfig) -> str | None:
        """Why the profile's host stamps do not time the GPU's work in this job (None: they do)."""
        return None

    def nccl_inert(self, hardware: HardwareConfig) -> str | None:
        """Why no NCCL runs in a job on this hardware, so that cells differing only in the NCCL profile are
        an A/A pair (analysis.control); None when it may run."""
        return CPU_NO_NCCL if hardware.device == "cpu" else None

    def server_env(self, cfg: ExperimentConfig) -> dict[str, str]:
        """What this engine's server env always gets from the config (never inherited)."""
        return {}

    def rank_nccl_env(self, env: dict[str, str], cfg: ExperimentConfig) -> dict[str, str]:
        """The NCCL variables the ranks run with, given the server's (what a launcher adds)."""
        return env


class EmbeddedEngine(Engine):
    """Ours (python -m spec_decode.engines.embedded): exact greedy decoding, one byte a token."""

    name = "embedded"
    exact_outputs = True  # "the embedded engine decodes exactly: speculation changed the output"
    byte_tokens = True
    # On CUDA the hooked cycle (Decoder.run_batch) returns once its kernels are queued: the loop reads the
    # result afterwards (BatchLoop.step: copy_to_cpu, host_ids), with overlap on or off. So the host stamps
    # bound the launch, not the GPU work, in both modes: with overlap off every spec job failed checks 1
    # and 2 on healthy runs (H200, 2026-12-04, docs/gpu-session-2026-12-04.md).
    HOST_STAMPS_NA = (
        "the embedded engine on CUDA: a cycle's host stamps span its launch (the loop reads its tokens "
        "after the cycle returns, overlap on or off), not its GPU work (cycle_ms: CUDA events)"
    )

    def engine_flags(self, cfg: ExperimentConfig) -> list[str]:
        return embedded_launch.engine_flags(cfg)

    def decodes_with_graphs(self, cfg: ExperimentConfig) -> bool:
        return cfg.hardware.device == "cuda" and not cfg.engine.cuda_eager_batching

    def host_stamps_na(self, cfg: ExperimentConfig) -> str | None:
        return self.HOST_STAMPS_NA if cfg.hardware.device == "cuda" else None

    def nccl_inert(self, hardware: HardwareConfig) -> str | None:
        # One rank makes no process group (engines.embedded.scheduler._init_distributed), so no NCCL
        # communicator exists. SGLang keeps the base answer: it sets up torch.distributed even at tp 1.
        if hardware.device != "cpu" and hardware.tp_size == 1:
            return "at tp 1 (the embedded engine makes no process group: no NCCL runs)"
        return super().nccl_inert(hardware)


class SglangEngine(Engine):
    """SGLang 0.5.23 or 0.5.17 (python -m sglang.launch_server), installed beside us (engines.sglang.SUPPORTED)."""

    name = "sglang"
    exact_outputs = False  # its GPU kernels are not always batch-invariant
    external = True
    package = "sglang"
    resolves_hub_ids = True
    refuses_eager_overflow = True
    supported_versions = tuple(sglang.SUPPORTED)
    install_hint = sglang.INSTALL_SUPPORTED
    HOST_STAMPS_NA = (
        "SGLang's overlap scheduler: a cycle's host stamps span its enqueue, not its GPU work "
        "(scheduler.py 2107-2120); no GPU timeline yet"
    )

    def engine_flags(self, cfg: ExperimentConfig) -> list[str]:
        return sglang.engine_flags(cfg)

    def installed_version(self) -> str | None:
        return sglang.installed_version()

    def version_error(self, v: str | None = None) -> str | None:
        return sglang.version_error(v)

    def config_warnings(self, cfg: ExperimentConfig, environ: dict[str, str]) -> list[str]:
        return sglang.config_warnings(cfg, environ)

    def default_max_running(self, speculative: bool) -> int | None:
        return sglang.SPEC_MAX_RUNNING_DEFAULT if speculative else None

    def decodes_with_graphs(self, cfg: ExperimentConfig) -> bool:
        return cfg.hardware.device == "cuda" and "--disable-cuda-graph" not in cfg.engine.extra_args

    def host_stamps_na(self, cfg: ExperimentConfig) -> str | None:
        return None if "--disable-overlap-schedule" in cfg.engine.extra_args else self.HOST_STAMPS_NA

    def server_env(self, cfg: ExperimentConfig) -> dict[str, str]:
        return {sglang.PCIE_IPC_ALLREDUCE: "1" if cfg.engine.pcie_ipc_allreduce else "0"}

    def rank_nccl_env(self, env: dict[str, str], cfg: ExperimentConfig) -> dict[str, str]:
        return sglang.rank_nccl_env(env, cfg.hardware.tp_size, list(cfg.engine.extra_args))


BY_NAME: dict[str, Engine] = {e.name: e for e in (EmbeddedEngine(), SglangEngine())}


def named(name: str) -> Engine:
    """The engine of a record's or a command's ``engine.name``."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"engine {name!r}: use one of {', '.join(BY_NAME)}") from None


def engine_of(cfg: ExperimentConfig) -> Engine:
    """The job's engine (``cfg.engine.name``, checked by the config's schema)."""
    return named(cfg.engine.name)
