"""Which MLflow store a command uses, and the rule that a command that only reads never creates one.

Order: the command's own flag (``--uri``, ``tracking.uri=``), else $MLFLOW_TRACKING_URI (MLflow's own
variable), else ``sqlite:///mlflow.db`` -- relative sqlite paths against the given root. Opening a
sqlite URI whose file does not exist makes MLflow create an empty store there, so readers check first.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_URI = "sqlite:///mlflow.db"
SQLITE = "sqlite:///"


class StoreMissing(FileNotFoundError):
    """A reader was pointed at a sqlite store that does not exist. The message says how to point it."""


def store_uri(flag: str | None = None, root: Path | None = None) -> str:
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith(SQLITE) and not uri[len(SQLITE) :].startswith("/"):
        return SQLITE + str(((root or Path.cwd()) / uri[len(SQLITE) :]).resolve())
    return uri


def sqlite_file(uri: str) -> Path | None:
    return Path(uri[len(SQLITE) :]) if uri.startswith(SQLITE) else None


def readable(uri: str) -> str:
    """``uri`` if reading it creates nothing; StoreMissing for a sqlite file that is not there."""
    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        raise StoreMissing(
            f"no MLflow store at {path} (from {uri}); nothing was created. Point to the sweep's store: "
            "export MLFLOW_TRACKING_URI=sqlite:////abs/path/to/mlflow.db, or pass --uri sqlite:////abs/path/to/mlflow.db"
        )
    return uri
