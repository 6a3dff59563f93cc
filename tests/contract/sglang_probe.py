"""Runs SGLang 0.5.23's own argument parsing in a separate process (its import needs the triton stub
and patches torch, which must not leak into the test process).

stdin: one JSON list of argv lists per line; stdout: per line read, one `PROBE_RESULT <JSON list>` line of
{"exit": code} or the resolved fields. The process answers line after line until stdin closes, so a test
session imports SGLang once (~4.5 s of CPU), not once per test (tests/contract/conftest.py).
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


def parse(argvs: list[list[str]]) -> list[dict]:
    out = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(argv)
            out.append({k: getattr(args, k, None) for k in FIELDS})
        except SystemExit as e:
            out.append({"exit": e.code, "stderr": err.getvalue()[-500:]})
    return out


for line in sys.stdin:
    if line.strip():
        print("PROBE_RESULT " + json.dumps(parse(json.loads(line))), flush=True)
