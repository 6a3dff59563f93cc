"""spec-decode-bench's main job: compose the config, run the benchmark job, return its throughput.

    python run.py                                             # one job, embedded engine
    python run.py -m spec.steps=1,2,3,5 nccl=tuned,default    # a sweep (+ the baseline arm)
    python run.py -m experiment=embedded_steps_nccl           # a reported experiment
    python run.py engine=sglang hardware=rtx_pro_6000x8 model=kimi_k25 drafter=kimi_k25_eagle3 dry_run=true
    python run.py --help                                      # config groups and options

Results: the job dir's results.json, and MLflow
(mlflow ui --backend-store-uri sqlite:///mlflow.db --app-name spec-decode).
"""

from __future__ import annotations

import os
import sys

from spec_decode.runner import interrupt

interrupt.install()  # first: a Ctrl-C during the imports below exits quietly

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from spec_decode.core.gc_imports import frozen_imports  # noqa: E402

with frozen_imports():  # without the cyclic GC's rescans (spec_decode/core/gc_imports.py)
    import hydra
    from omegaconf import DictConfig

    from spec_decode.core.config import ConfigError, register_configs
    from spec_decode.core.overrides import check_argv

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    with frozen_imports():  # lazy: the job's modules load after Hydra's --help and --cfg answered
        from spec_decode.hydra_entry import run_from_hydra

    return run_from_hydra(cfg)


if __name__ == "__main__":
    try:  # a key the schema lacks (spec.step=3, +spec.step=3): refused before Hydra composes
        check_argv(sys.argv[1:])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    # interrupt.started() comes with the first thing to clean up (the sweep's parent run, a job); while
    # Hydra composes before it, a Ctrl-C exits at once (raised inside OmegaConf, it would leave a
    # half-set config whose clean-up error Hydra reports as the cause, exit 1)
    try:
        main()
        if (sweep := sys.modules.get("spec_decode.views.sweep")) is not None and sweep.EXIT_STATUS:
            raise SystemExit(sweep.EXIT_STATUS)  # a sweep in which no job finished
    except KeyboardInterrupt as e:  # the job recorded itself KILLED; the sweep's atexit writes the summary
        interrupt.exit_killed(str(e) or interrupt.MESSAGE)
    except SystemExit as e:  # a Ctrl-C between two jobs, while Hydra composed the next: Hydra exits 1
        if not interrupt.interrupted() or e.code in (0, None, interrupt.EXIT_CODE):
            raise
        interrupt.exit_killed(interrupt.MESSAGE)
