"""A fake engine launcher at the process boundary (tests only). As SGLang 0.5.23's launcher does, it
writes NCCL variables into its own os.environ in Python and only then starts the rank processes,
which inherit them -- so its own /proc/<pid>/environ never shows them:

    python tests/rank_launcher.py <embedded engine flags>

It writes SGLang's launcher writes (spec_decode.engines.sglang.ENV_WRITES, GRAPH_REGISTER) where
unset; with LAUNCHER_DETERMINISTIC=1 also the --enable-deterministic-inference overwrites
(DETERMINISTIC_WRITES, the NCCL profile's values included). Then it runs the embedded engine in this
same process, whose front spawns one rank process per --tp-size rank.
"""

import os
import runpy
import sys

from spec_decode.engines.sglang import DETERMINISTIC_WRITES, ENV_WRITES, GRAPH_REGISTER

for name, (value, _) in ENV_WRITES.items():
    if name not in os.environ:
        os.environ[name] = value
os.environ.setdefault(*GRAPH_REGISTER)
if os.environ.get("LAUNCHER_DETERMINISTIC") == "1":
    os.environ.update(DETERMINISTIC_WRITES)
sys.argv = ["spec_decode.engines.embedded", *sys.argv[1:]]
runpy.run_module("spec_decode.engines.embedded", run_name="__main__", alter_sys=True)
