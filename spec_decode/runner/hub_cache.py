"""Preflight's answer for a Hugging Face hub id as ``model.path`` (an engine that resolves them: SGLang): the
server runs offline (HF_HUB_OFFLINE=1), so the model must be in the local cache that the server's environment
names, weights and all; a path that git or DVC tracks is a local path whatever its shape."""

from __future__ import annotations

import re
import string
from pathlib import Path

from spec_decode.runner.preflight_items import (
    Preflight,
    dvc_tracked,
    git_tracked,
    has_weights,
    missing_weights,
    read_json,
)


def _expand(value: str, environ: dict[str, str]) -> Path:
    """``$VAR`` and a leading ``~`` as the server's shell would read them: from ``environ``, not ours."""
    text = string.Template(value).safe_substitute(environ)
    if text == "~" or text.startswith("~/"):
        text = environ.get("HOME", str(Path.home())) + text[1:]
    return Path(text)


def hub_cache_dir(environ: dict[str, str]) -> Path:
    """Where a Hugging Face hub id's files live offline, in the server's environment: HF_HUB_CACHE, else
    HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub (huggingface_hub's order)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(name):
            return _expand(environ[name], environ)
    home = environ.get("HF_HOME") or str(Path(environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return _expand(home, environ) / "hub"


def hub_repo_dir(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def hub_snapshot(repo_id: str, environ: dict[str, str]) -> Path | None:
    """The cached snapshot of model ``repo_id`` that an offline load finds: refs/main's (offline, the revision
    "main" resolves through refs/main alone), with its config.json and weights; None if absent."""
    repo = hub_cache_dir(environ) / hub_repo_dir(repo_id)
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    snap = repo / "snapshots" / ref.read_text().strip()
    return snap if has_weights(snap) else None


# A Hugging Face repo id: ``org/name``, letters, digits, '-', '_', '.'; no '--' or '..'; not '-' or '.' first.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_id(path: str, local: Path, root: Path) -> bool:
    """A repo id (``org/name``) that is no path here: SGLang resolves it from the hub's cache. One whose first
    part exists in the checkout (``models/...``) is a local path."""
    if local.exists() or not _REPO_ID.match(path) or "--" in path or ".." in path:
        return False
    return not (root / path.split("/")[0]).exists()


def check_hub_model(
    path: str, local: Path, root: Path, pf: Preflight, dry_run: bool, environ: dict[str, str]
) -> dict | None:
    """A hub id must be in the local cache of the server's environment (``environ``: it runs with
    HF_HUB_OFFLINE=1 and downloads nothing), weights and all; its cached config.json, for the shape checks.
    Not there, and git or DVC tracks the path: the local missing-weights answer (``dvc pull`` ...)."""
    snapshot = hub_snapshot(path, environ)
    if snapshot is None and (git_tracked(root, path) or dvc_tracked(root, path)):
        pf.need(False, missing_weights(root, path, "model.path"), local=True, dry_run=dry_run)
        return None
    repo = hub_cache_dir(environ) / hub_repo_dir(path)
    pf.need(
        snapshot is not None,
        f"model.path={path} is neither a local directory (no {local}) nor in the Hugging Face cache (no "
        f"{repo}/refs/main whose snapshot holds config.json and weights); the server runs offline "
        f"(HF_HUB_OFFLINE=1) and downloads nothing: fix the path, or fetch the model into that cache first "
        f"(hf download {path}; the cache is HF_HUB_CACHE or HF_HOME, this shell's or engine.env's)",
        local=True,
        dry_run=dry_run,
    )
    return (
        None
        if snapshot is None
        else read_json(snapshot / "config.json", pf, "the model's config.json (Hugging Face cache)")
    )
