"""``mlflow ui --app-name spec-decode``: MLflow's own server whose UI opens an experiment on its runs table.

Why a server app and not an experiment tag (MLflow 3.17.2's JS bundle, read 2026-12-04): the experiment
page's default tab follows the *workflow type*: the URL's ``workflowType``, else the browser's localStorage
``mlflow.workflowType_v1``, else ``genai``, whose experiment page is the traces Overview with a "Detect
Issues" popup. The hook that would read the experiment's ``mlflow.experimentKind`` tag instead is switched
off in this build (``Fi``: ``Z0()`` is ``true``), so a click on the experiment in a fresh browser lands on
the GenAI Overview whatever the store says. This app serves MLflow's own app with one line added to the
UI's index.html: where the browser has no workflow type yet, it becomes ``machine_learning`` ("Model
training": an experiment opens on Runs), and the assistant panel does not open by itself on the first
visit. A choice the user made in the UI stays.

Registered as the ``mlflow.app`` entry point ``spec-decode`` (pyproject.toml); MLflow's server loads it.
"""

from __future__ import annotations

import json

from spec_decode.core.gc_imports import frozen_imports

# The 3.17.2 UI's localStorage keys (its useLocalStorage: `${key}_v${version}`, JSON values), each set only
# where the browser has none: "Model training", and the assistant panel not opened on its own on the
# first visit (it takes a third of the window from the runs table; its button still opens it).
DEFAULTS = {
    "mlflow.workflowType_v1": "machine_learning",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}
SCRIPT = (
    "<script>try{var d=%s;for(var k in d)if(localStorage.getItem(k)===null)localStorage.setItem(k,d[k])}"
    "catch(e){}</script>" % json.dumps({k: json.dumps(v) for k, v in DEFAULTS.items()}, separators=(",", ":"))
)


def with_default_workflow(html: str) -> str:
    """index.html with the default set first thing in <head>, before the bundle's deferred script runs."""
    if SCRIPT in html or "<head>" not in html:
        return html
    return html.replace("<head>", "<head>" + SCRIPT, 1)


def create_app():
    """The ASGI app ``mlflow ui``/``mlflow server`` runs (a factory: uvicorn calls it in the worker)."""
    with frozen_imports():  # lazy: the MLflow server (seconds of imports) loads only in the server's own process
        from mlflow.server import app as flask_app
        from mlflow.server.fastapi_app import app

    @flask_app.after_request
    def _default_workflow(response):
        if response.status_code == 200 and response.mimetype == "text/html":
            response.direct_passthrough = False  # index.html is sent as a file: read it to edit it
            response.set_data(with_default_workflow(response.get_data(as_text=True)))
        return response

    return app
