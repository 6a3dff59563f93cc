"""Typed configuration: dataclass schemas (registered in Hydra's ConfigStore) and cross-field rules.

Values live in conf/<group>/*.yaml; these schemas make Hydra refuse a wrong type or an unknown key at
compose time, naming the key (``spec.steps=three``). Rules that involve several fields run in
``__post_init__`` when the composed config is turned into objects (``to_experiment``), before any
server starts.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from spec_decode.core import drafter as drafter_rules
from spec_decode.core.engine_config import ENGINES, EngineConfig
from spec_decode.core.errors import ConfigError
from spec_decode.core.groups import HardwareConfig, SpecConfig
from spec_decode.core.identity import config_hash, flatten, override_items, resolved_dict  # noqa: F401 - re-exported
from spec_decode.core.synthetic import SyntheticConfig, SyntheticError, load_table

__all__ = ["ConfigError", "ENGINES", "EngineConfig", "ExperimentConfig", "register_configs", "to_experiment"]

# benchmark.pairing: the two ways a paired baseline runs beside the spec server (runner/pairing.py)
INTERLEAVED = "interleaved"
CONCURRENT = "concurrent"
PAIRINGS = (INTERLEAVED, CONCURRENT)


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
    # A drafter of a real shape with seeded random weights (core/synthetic.py): generated, never trained.
    synthetic: Optional[SyntheticConfig] = None


@dataclass
class ModelConfig:
    name: str = MISSING
    path: str = MISSING
    num_layers: Optional[int] = None  # for checks when config.json is not on this machine
    trust_remote_code: bool = False  # ships its own model code (auto_map): engine=sglang passes --trust-remote-code
    # A target of a real shape with seeded random weights (core/synthetic.py): performance work only.
    synthetic: Optional[SyntheticConfig] = None


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
    # With profile: the hooks stay dormant in the timed runs; after them (last launch) this many pairs
    # of the protocol request, profiler on / dormant (ABBA): the profile and the profiler's own effect.
    profile_pairs: int = 3
    baseline_arm: bool = True  # measure the matching no-speculation baseline once per sweep key
    # Paired baseline: a baseline server up beside the spec server, timed runs alternating between
    # them, the speedup taken per pair (machine noise hits both arms of a pair alike). null = auto:
    # on where two servers fit side by side (CPU; GPUs >= 2 x tp_size), off where they cannot (one
    # 8-GPU model on an 8-GPU box).
    paired: Optional[bool] = None
    # How a paired run meets its baseline run (spec_decode/runner/pairing.py): "interleaved" = one after the
    # other (ABBA); "concurrent" = both at once, each server pinned to its own cores. Interleaved is the
    # default: concurrent was not tighter here and its arms slow each other (docs/paired-baseline.md).
    pairing: str = INTERLEAVED
    # CPU weight of the servers against other work on a shared machine: the nice of each server's
    # scheduler autogroup (Linux; -20..19, negative needs root). null = leave it (0). Other sessions'
    # load both widens the speedup CI and biases it toward short requests (docs/paired-baseline.md).
    server_nice: Optional[int] = None
    # The CPU cores every server of the job is pinned to, taskset's list ("2-5", "2,3,8-9"): each thread of
    # its process tree (the front or launcher, the ranks) set to them once it is up, the same cores in every
    # launch, so the server's host threads run where they ran last launch (the lent GPU VM's vCPUs differ in
    # speed: runner.machine.probe_us). null = where the OS puts them. Read back per launch
    # (launches[].server_cpus); not with benchmark.pairing=concurrent, which pins each arm to its own half.
    server_cpus: Optional[str] = None
    # true: the warmup and timed runs stream (SSE): TTFT, per-token ITL, TPOT per run (the job's
    # `latency`); tok/s keeps its definition (completion_tokens / client wall time). Off by default:
    # on this 2-core host streaming cost the embedded engine's timed tok/s 6-15% (the front encodes and
    # the client parses one event per cycle beside the decoding rank; docs/latency.md), so the timed
    # protocol stays comparable with the non-streamed one.
    stream: bool = False
    # After the timed runs, one streamed greedy request per prompt of request_prompts: per-request and
    # per-category acceptance, tok/s, TTFT, outputs for the lossless guard. Off by default: it adds
    # about n_prompts x request_max_new_tokens of decoding to every job and its figures are separate
    # from the timed protocol's (which it cannot change: it runs after them, outside their windows).
    request_pass: bool = False
    request_prompts: str = "data/prompts_categorized.jsonl"
    request_max_new_tokens: int = 128
    # Issue 25 (docs/reproducibility.md, spec_decode/analysis/{blocks,control}.py): an experiment whose first
    # sweep axis is benchmark.block=range(0,${benchmark.blocks}) runs the whole sweep `blocks` times, each
    # cell's interval taken over its blocks (1 = the cheap mode: one launch, the within-launch interval).
    # block and replicate are labels with no effect on a job; replicate=0,1 on one cell = an A/A twin.
    blocks: int = 1
    block: int = 0
    replicate: int = 0
    # Issue 28, the load axis (spec_decode/runner/load.py). concurrency = N closed-loop clients, each
    # sending its next request as soon as its last returned, over the prompts of load_prompts (varied
    # lengths); 1 with request_rate null and load null = today's protocol (one prompt, bs 1), unchanged.
    concurrency: int = 1
    # null = closed loop; a rate (requests/s) = open loop: seeded Poisson arrivals (load_seed), at most
    # `concurrency` in flight (SGLang bench_serving's --request-rate with --max-concurrency).
    request_rate: Optional[float] = None
    # null: the load protocol runs when concurrency > 1 or request_rate is set; true: also at
    # concurrency 1 (so that a concurrency sweep's 1 is measured like its 4 and 16: same prompts).
    load: Optional[bool] = None
    load_prompts: str = "data/prompts_load.jsonl"
    # Requests per timed run under load; null = 4 x concurrency (each client sends 4 on average).
    load_requests: Optional[int] = None
    load_seed: int = 0  # the open loop's arrival times and the prompt order

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(
                f"benchmark.concurrency={self.concurrency}: must be >= 1 (1 = one request at a "
                "time, the default protocol)"
            )
        rate = self.request_rate
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise ConfigError(
                f"benchmark.request_rate={rate}: must be > 0 requests/s (Poisson arrivals), or "
                "null for closed-loop clients"
            )
        if self.load_requests is not None and self.load_requests < self.concurrency:
            raise ConfigError(
                f"benchmark.load_requests={self.load_requests} is below benchmark.concurrency="
                f"{self.concurrency}: the clients could never hold {self.concurrency} requests "
                "in flight; raise it or leave it null (4 x concurrency)"
            )
        if self.pairing not in PAIRINGS:
            raise ConfigError(f"benchmark.pairing={self.pairing}: must be one of {', '.join(PAIRINGS)}")
        if self.server_nice is not None and not -20 <= self.server_nice <= 19:
            raise ConfigError(f"benchmark.server_nice={self.server_nice}: must be in -20..19 (or null)")
        if self.server_cpus is not None:
            self.cpu_set()  # a list that does not parse: refused here, naming the key
        for key in ("runs", "launches", "max_new_tokens", "request_max_new_tokens", "profile_pairs"):
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

    def cpu_set(self) -> set[int] | None:
        """``server_cpus`` as a set of core ids (None: not pinned); ConfigError for a list that does not parse."""
        if self.server_cpus is None:
            return None
        cores: set[int] = set()
        for part in str(self.server_cpus).replace(" ", "").split(","):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
                raise ConfigError(
                    f"benchmark.server_cpus={self.server_cpus}: a list of CPU cores as taskset -c takes it "
                    "(e.g. 2-5 or 2,3,8-9), or null"
                )
            cores.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
        return cores

    @property
    def under_load(self) -> bool:
        """Whether the timed runs use the load protocol (runner/load.py) instead of one request at a time."""
        if self.load is not None:
            return self.load
        return self.concurrency > 1 or self.request_rate is not None

    @property
    def requests_per_run(self) -> int:
        return self.load_requests if self.load_requests is not None else 4 * self.concurrency


@dataclass
class TrackingConfig:
    enabled: bool = True
    # Relative sqlite paths and artifact folders resolve against the directory run.py starts in.
    uri: str = "sqlite:///mlflow.db"
    artifact_location: str = "mlartifacts"
    experiment: str = "spec-decode-bench"
    # Where the drift guard looks for earlier baselines' results.json when MLflow is off or
    # unreachable (relative to the project root): Hydra's default run and sweep roots.
    results_dirs: list[str] = field(default_factory=lambda: ["outputs", "multirun"])


@dataclass
class PreflightConfig:
    # Measure all-reduce latency at decode sizes under the job's NCCL profile before the server
    # starts (python -m spec_decode.probe.nccl); gloo with 2 processes on a CPU profile.
    nccl_probe: bool = False
    nccl_probe_iters: int = 200
    # Serve a drafter on other target layers than drafter.layer_ids / its training.json say (the seed's
    # bug, reproduced on purpose by a layer-id experiment): the mismatch is a warning, not an error.
    allow_layer_id_mismatch: bool = False


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
        self.engine.check(self.spec, self.hardware)
        ids = self.drafter.layer_ids
        if ids is not None and (why := drafter_rules.layer_ids_error(list(ids))) is not None:
            raise ConfigError(f"drafter.layer_ids={ids}: {why}")
        if ids is not None and self.model.num_layers is not None and max(ids) > self.model.num_layers - 2:
            raise ConfigError(
                f"drafter.layer_ids={ids}: model={self.model.name} has {self.model.num_layers} layers, "
                f"so ids must be in 0..{self.model.num_layers - 2}"
            )

        hw = self.hardware
        if self.benchmark.paired and hw.device == "cuda" and hw.num_gpus < 2 * hw.tp_size:
            raise ConfigError(
                f"benchmark.paired=true needs 2 x hardware.tp_size = {2 * hw.tp_size} GPUs for the spec and the "
                f"baseline server side by side, but hardware={hw.name} has {hw.num_gpus}: use benchmark.paired=false"
            )

    @property
    def speculative(self) -> bool:
        return self.drafter.path is not None

    @property
    def paired(self) -> bool:
        """Whether a spec job measures its baseline paired (benchmark.paired, null = where it fits)."""
        if not (self.speculative and self.benchmark.baseline_arm):
            return False
        if self.benchmark.paired is not None:
            return self.benchmark.paired
        return self.hardware.device == "cpu" or self.hardware.num_gpus >= 2 * self.hardware.tp_size

    @property
    def baseline_strategy(self) -> str:
        """A spec job's one baseline (docs/paired-baseline.md): ``paired`` (a baseline server beside its
        own, benchmark.paired), ``job`` (a separate baseline job, shared in a sweep), or ``none``."""
        if not (self.speculative and self.benchmark.baseline_arm):
            return "none"
        return "paired" if self.paired else "job"


DIR_NAME_MAX = 120  # characters of a job dir's name (after "<num>_" in a sweep)


def dir_name(overrides: str) -> str:
    """A safe directory name from a job's overrides: no '/', at most DIR_NAME_MAX characters. A longer one
    first drops the keys' dotted heads (``spec.steps=3`` -> ``steps=3``: the values, which tell the jobs of
    a sweep apart, stay whole) where that leaves no two items the same key; if still too long, a readable
    head. A shortened name ends with a hash of the whole (``~`` and 6 or 10 hex digits), so two never meet."""
    name = _safe(overrides) or "defaults"
    if len(name) <= DIR_NAME_MAX:
        return name
    digest = hashlib.sha256(overrides.encode()).hexdigest()
    items = override_items(overrides)
    keys = [item.split("=", 1)[0].lstrip("+~").rsplit(".", 1)[-1] for item in items]
    if len(set(keys)) == len(keys):
        short = _safe(",".join(f"{k}={item.split('=', 1)[1]}" if "=" in item else item for k, item in zip(keys, items)))
        if len(short) <= DIR_NAME_MAX - 7:
            return f"{short}~{digest[:6]}"
        name = short
    return name[: DIR_NAME_MAX - 11] + "~" + digest[:10]


def _safe(text: str) -> str:
    return text.replace("/", "_").replace("\\", "")


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=ExperimentConfig)
    for name, schema in ENGINES.items():  # conf/engine/<name>.yaml lists base_<name> in its defaults
        cs.store(group="engine", name=f"base_{name}", node=schema)
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
        if isinstance(cause, SyntheticError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(str(e)) from None
    assert isinstance(obj, ExperimentConfig)
    resolve_accept_table(obj)
    check_forced_acceptance(obj)
    return obj


def resolve_accept_table(cfg: ExperimentConfig) -> None:
    """spec.simulate_accept_table=<name> sets spec.simulate_accept_len from the table at spec.steps
    (both stay in the record: the number that ran and where it came from)."""
    s = cfg.spec
    if s.simulate_accept_table is None:
        return
    if s.simulate_accept_len is not None:
        raise ConfigError(
            f"spec.simulate_accept_table={s.simulate_accept_table} and spec.simulate_accept_len="
            f"{s.simulate_accept_len}: set one of them"
        )
    try:
        s.simulate_accept_len = load_table(s.simulate_accept_table).at(s.steps).accept_len
    except SyntheticError as e:
        raise ConfigError(str(e)) from None


def check_forced_acceptance(cfg: ExperimentConfig) -> None:
    """spec.simulate_accept_len only with speculation. A rule of the composed config, not of
    ExperimentConfig.__post_init__: the job's baseline arm is the same config without its drafter
    (runner.baselines.baseline_config), which keeps spec.* and must stay constructible."""
    x = cfg.spec.simulate_accept_len
    if x is not None and not cfg.speculative:
        raise ConfigError(
            f"spec.simulate_accept_len={x} with drafter={cfg.drafter.name}: forced acceptance needs "
            "speculative decoding (a drafter); drop spec.simulate_accept_len for the baseline"
        )
    if cfg.spec.simulate_token_mode != "fixed" and x is None:
        raise ConfigError(
            f"spec.simulate_token_mode={cfg.spec.simulate_token_mode} without "
            "spec.simulate_accept_len: the token mode only applies to forced acceptance; "
            "set spec.simulate_accept_len (or spec.simulate_accept_table), or drop the mode"
        )
