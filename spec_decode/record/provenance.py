"""The record's ``provenance`` section as a type (``Provenance``), and the rules the record is written under:
which environment variables it keeps (``filter_env``), which are secrets (redacted by name, ``redact_env``;
scrubbed by value from the whole record at its one write, ``dumps_clean``). The facts of the provenance are
collected by the runner (``runner.provenance``); the ranks' environment is derived in ``analysis.sections``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from spec_decode.record.typed import ABSENT, Maybe, names, read, written

ENV_PREFIXES = (
    "NCCL_",
    "SGLANG_",
    "CUDA_",
    "TORCH_",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "SPEC_DECODE_",
    "OMP_NUM_THREADS",
)
# Set by the engine for each launch, never a setting: SGLang writes a fresh SGLANG_RUN_ID into its
# launcher's environment (srt/entrypoints/engine.py: 0.5.17 1613, 0.5.23 1936), which its ranks
# inherit. Kept out of the record's environment, or every comparison of two launches (the drift guard)
# would call it a change.
PER_LAUNCH = frozenset({"SGLANG_RUN_ID"})
SECRET = re.compile(r"(TOKEN|_KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
REDACTED = "***redacted***"
# Names the pattern matches that are settings, not secrets (exact names only).
NOT_SECRET = frozenset({"SGLANG_SIMULATE_ACC_TOKEN_MODE"})  # SGLang's forced-acceptance token mode


def is_secret(name: str) -> bool:
    return name not in NOT_SECRET and bool(SECRET.search(name))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def filter_env(env: dict[str, str]) -> dict[str, str]:
    """The variables that change a server's behaviour, secrets redacted, sorted."""
    return redact_env({k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES) and k not in PER_LAUNCH})


def secret_values(env: dict[str, str] | None = None) -> list[str]:
    """Values of secret-looking variables in our environment (to scrub from anything we write)."""
    env = os.environ if env is None else env
    return [v for k, v in env.items() if is_secret(k) and len(v) >= 6]


def scrub(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, REDACTED)
    return text


def dumps_clean(obj: object, secrets: list[str]) -> str:
    return scrub(json.dumps(obj, indent=2, sort_keys=False, default=str), secrets)


@dataclass
class Provenance:
    """The record's ``provenance``: what explains a number, as the runner collected it when the job started
    (``runner.provenance.collect``: ``root`` .. ``data``), the drafter's lineage tags (a spec job) and the
    NCCL probe's facts (``analysis.sections.nccl_section``). Each part is its collector's dict. A key the
    record does not have stays absent (``ABSENT``: a record rebuilt from metrics.json has none, an older
    one fewer); one collected as None (``gpu`` on a machine without one) is written null."""

    root: str | Maybe = ABSENT  # the project root the job ran in (its dvc.lock)
    git: dict | Maybe = ABSENT  # commit, dirty, dirty_paths, code_dirty, tree (the files' git tree, since 2026-12-06)
    packages: dict[str, str | None] | Maybe = ABSENT  # name -> version
    machine: dict | Maybe = ABSENT  # python, platform, cpu, cpu_count, hostname
    gpu: dict | None | Maybe = ABSENT  # GPU names, driver, topology; None: no nvidia-smi
    host: dict | Maybe = ABSENT  # the host fingerprint (runner.machine.fingerprint)
    data: dict[str, dict] | Maybe = ABSENT  # input name -> {path, dvc_md5 | sha256 | missing}
    drafter_lineage: dict[str, str] | Maybe = ABSENT  # a spec job: the drafter's training tags
    nccl: dict | Maybe = ABSENT  # the NCCL probe's backend, version, algorithms, protocols
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(Provenance))


def provenance_from(data: dict | None) -> Provenance:
    """A ``provenance`` section as JSON holds it -> typed (absent or null: an empty one, written ``{}``)."""
    return read(Provenance, data) if data is not None else Provenance()
