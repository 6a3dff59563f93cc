"""Runs SGLang 0.5.23's own argument parsing in a separate process (its import needs the triton stub
and patches torch, which must not leak into the test process).

stdin: a JSON list of argv lists; stdout: a JSON list of {"exit": code} or the resolved fields.
"""

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "stubs"))

from sglang.srt.server_args import prepare_server_args  # noqa: E402

FIELDS = (
    "tp_size",
    "random_seed",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "host",
    "port",
    "decode_log_interval",
    "enable_metrics",
    "model_path",
    "speculative_draft_model_path",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
)

out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
        out.append({k: getattr(args, k, None) for k in FIELDS})
    except SystemExit as e:
        out.append({"exit": e.code, "stderr": err.getvalue()[-500:]})
print("PROBE_RESULT " + json.dumps(out))
