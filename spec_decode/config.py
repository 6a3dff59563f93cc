"""Typed configuration: dataclass schemas (registered in Hydra's ConfigStore) and cross-field rules.

Values live in conf/<group>/*.yaml; these schemas make Hydra refuse a wrong type or an unknown key at
compose time, naming the key (``spec.steps=three``). Rules that involve several fields run in
``__post_init__`` when the composed config is turned into objects (``to_experiment``), before any
server starts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the key and says what to do."""


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
    slots_dir: str = "/tmp/spec_decode_slots"

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
class NcclConfig:
    name: str = MISSING
    # Set in the server process only, never in the runner's own environment.
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class DrafterConfig:
    name: str = MISSING
    path: Optional[str] = None  # None: baseline, no speculation
    # The target layers the drafter reads (SGLang's eagle_aux_hidden_state_layer_ids). Preflight
    # checks the checkpoint's config.json and its training record against these.
    layer_ids: Optional[list[int]] = None


@dataclass
class SpecConfig:
    steps: int = 2
    topk: int = 1
    # Derived: SGLang forces steps + 1 when topk == 1; set it only for topk > 1.
    num_draft_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"spec.steps={self.steps}: must be >= 1 (use drafter=none for the baseline)")
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


@dataclass
class ModelConfig:
    name: str = MISSING
    path: str = MISSING
    num_layers: Optional[int] = None  # for checks when config.json is not on this machine


@dataclass
class EngineConfig:
    name: str = MISSING  # embedded | sglang
    launcher: list[str] = field(default_factory=list)  # a leading "python" means this interpreter
    host: str = "127.0.0.1"
    port: int = 30000  # replaced by a free port when taken
    random_seed: int = 0
    decode_log_interval: int = 10
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    cuda_graph_max_bs_decode: Optional[int] = None  # sglang only
    enable_metrics: bool = False  # sglang only
    extra_args: list[str] = field(default_factory=list)  # passed verbatim, logged
    env: dict[str, str] = field(default_factory=dict)  # extra server env (not NCCL: use nccl=)

    def __post_init__(self) -> None:
        if self.name not in ("embedded", "sglang"):
            raise ConfigError(f"engine.name={self.name!r}: use engine=embedded or engine=sglang")
        if not self.launcher:
            raise ConfigError("engine.launcher is empty: it is the command that starts the server")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"engine.port={self.port}: must be in 0..65535")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError("engine.startup_timeout_s and engine.request_timeout_s must be > 0")
        if self.decode_log_interval < 1:
            raise ConfigError(f"engine.decode_log_interval={self.decode_log_interval}: must be >= 1")


@dataclass
class BenchmarkConfig:
    warmup: int = 1
    runs: int = 5
    launches: int = 1  # > 1 repeats the server launch (variance between launches vs runs)
    max_new_tokens: int = 500
    temperature: float = 0.0
    ignore_eos: bool = True
    prompts: str = "data/prompts.jsonl"
    prompt_index: int = 0
    profile: bool = True  # per-cycle phase profile (SPEC_DECODE_PROFILE in the server env)
    baseline_arm: bool = True  # measure the matching no-speculation baseline once per sweep key

    def __post_init__(self) -> None:
        for key in ("runs", "launches", "max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"benchmark.{key}={getattr(self, key)}: must be >= 1")
        if self.warmup < 0:
            raise ConfigError(f"benchmark.warmup={self.warmup}: must be >= 0")
        if self.temperature != 0.0:
            raise ConfigError(
                f"benchmark.temperature={self.temperature}: the protocol is greedy (0.0) so that runs "
                "are comparable and acceptance is deterministic"
            )
        if self.prompt_index < 0:
            raise ConfigError(f"benchmark.prompt_index={self.prompt_index}: must be >= 0")


@dataclass
class TrackingConfig:
    enabled: bool = True
    # Relative sqlite paths and artifact folders resolve against the directory run.py starts in.
    uri: str = "sqlite:///mlflow.db"
    artifact_location: str = "mlartifacts"
    experiment: str = "spec-decode-bench"


@dataclass
class PreflightConfig:
    # Measure all-reduce latency at decode sizes under the job's NCCL profile before the server
    # starts (python -m spec_decode.nccl_probe); gloo with 2 processes on a CPU profile.
    nccl_probe: bool = False
    nccl_probe_iters: int = 200


@dataclass
class ExperimentConfig:
    hardware: HardwareConfig = MISSING
    nccl: NcclConfig = MISSING
    drafter: DrafterConfig = MISSING
    spec: SpecConfig = MISSING
    model: ModelConfig = MISSING
    engine: EngineConfig = MISSING
    benchmark: BenchmarkConfig = MISSING
    tracking: TrackingConfig = MISSING
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    name: str = "adhoc"  # the experiment this job belongs to (experiment=<name> sets it)
    dry_run: bool = False  # print each job's server command and env; launch nothing
    fail_fast: bool = False  # stop the sweep at the first failed job

    def __post_init__(self) -> None:
        if self.engine.name == "sglang" and self.hardware.device == "cpu":
            raise ConfigError(
                f"engine=sglang with hardware={self.hardware.name} (a CPU profile): SGLang's EAGLE-3 "
                "path needs GPUs; use a GPU hardware profile, or engine=embedded on CPU"
            )
        ids = self.drafter.layer_ids
        if ids is not None and (len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0):
            raise ConfigError(f"drafter.layer_ids={ids}: EAGLE-3 reads 3 distinct target layers")
        if ids is not None and self.model.num_layers is not None and max(ids) > self.model.num_layers - 2:
            raise ConfigError(
                f"drafter.layer_ids={ids}: model={self.model.name} has {self.model.num_layers} layers, "
                f"so ids must be in 0..{self.model.num_layers - 2}"
            )

    @property
    def speculative(self) -> bool:
        return self.drafter.path is not None


def dir_name(overrides: str) -> str:
    """A safe directory name from a job's overrides: no '/', at most ~100 characters (long ones keep a
    readable head and a hash of the whole)."""
    name = overrides.replace("/", "_").replace("\\", "") or "defaults"
    if len(name) > 100:
        name = name[:88] + "~" + hashlib.sha256(overrides.encode()).hexdigest()[:10]
    return name


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=ExperimentConfig)
    if not OmegaConf.has_resolver("dirname"):
        OmegaConf.register_new_resolver("dirname", dir_name)


def to_experiment(cfg: DictConfig) -> ExperimentConfig:
    """The composed config as typed objects, with every cross-field rule checked."""
    try:
        plain = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
        obj = OmegaConf.to_object(plain)
    except ConfigError:
        raise
    except Exception as e:  # omegaconf wraps __post_init__ errors; unwrap ours
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(e)) from None
    assert isinstance(obj, ExperimentConfig)
    return obj


def resolved_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The resolved config as plain data: what results.json stores and the config hash covers."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def config_hash(data: dict[str, Any]) -> str:
    """Equal for equal resolved configs (key order does not matter)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
