"""What NCCL_DEBUG=INFO output says (``parse_nccl_debug``): the NCCL version, the algorithm and protocol
NCCL chose for all-reduce per size, the transports between ranks and the NCCL_* variables it read.
The probe (``probe.nccl``) runs its debug pass with ``NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING,COLL`` and
parses the ranks' files with it."""

from __future__ import annotations

import re
from collections import Counter

# NCCL's ids (enqueue.cc: ncclAlgoToString / ncclProtoToString) -> the spelling of NCCL_ALGO/NCCL_PROTO
ALGO_NAMES = {
    "TREE": "Tree",
    "RING": "Ring",
    "COLLNET_DIRECT": "CollNetDirect",
    "COLLNETDIRECT": "CollNetDirect",
    "COLLNET_CHAIN": "CollNetChain",
    "COLLNETCHAIN": "CollNetChain",
    "NVLS": "NVLS",
    "NVLS_TREE": "NVLSTree",
    "NVLSTREE": "NVLSTree",
    "PAT": "PAT",
}
PROTO_NAMES = {"LL": "LL", "LL128": "LL128", "SIMPLE": "Simple"}
# NCCL <= 2.18 printed numbers ("4096 Bytes -> Algo 1 proto 0 time 10.5"): these orders.
ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOS = ("LL", "LL128", "Simple")

_VERSION = re.compile(r"NCCL version ([\w.+\-]+)")
# NCCL >= 2.19, rank 0 only: "AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}"
_TUNING = re.compile(
    r"\bAllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?"
)
_TUNING_OLD = re.compile(r"\b(\d+) Bytes -> Algo (\d+) proto (\d+)")
# Symmetric-memory kernels (registered windows; torch does not use them by default)
_TUNING_SYM = re.compile(r"\bAllReduce \[Symmetric\]: (\d+) Bytes -> Kernel (\S+) nchannels (\d+)")
_CHANNEL = re.compile(r"Channel \d+(?:/\d+)? : \d+\[\d+\] -> \d+\[\d+\] via (\S+)")
_ENV = re.compile(r"\b(NCCL_\w+) set by environment to (\S+?)\.?$")


def parse_nccl_debug(text: str) -> dict:
    """What NCCL_DEBUG=INFO output (any number of ranks' files, concatenated) says: NCCL version,
    the algorithms and protocols NCCL chose for all-reduce (overall and per size), the transports
    between ranks (P2P/..., SHM/..., NET/...), and the NCCL_* variables NCCL read."""
    version = _VERSION.search(text)
    seen: dict[int, Counter] = {}
    transports: set[str] = set()
    env_seen: dict[str, str] = {}
    evidence: list[str] = []

    def choose(size: int, algo: str, proto: str, channels: int | None, line: str) -> None:
        seen.setdefault(size, Counter())[(algo, proto, channels)] += 1
        if len(evidence) < 20:
            evidence.append(line.strip())

    for line in text.splitlines():
        if m := _TUNING.search(line):
            a, p = m.group(2).upper(), m.group(3).upper()
            ch = int(m.group(5)) - int(m.group(4)) + 1 if m.group(4) is not None else None
            choose(int(m.group(1)), ALGO_NAMES.get(a, m.group(2)), PROTO_NAMES.get(p, m.group(3)), ch, line)
        elif m := _TUNING_SYM.search(line):
            choose(int(m.group(1)), "Symmetric", m.group(2), int(m.group(3)), line)
        elif m := _TUNING_OLD.search(line):
            a, p = int(m.group(2)), int(m.group(3))
            choose(
                int(m.group(1)),
                ALGOS[a] if a < len(ALGOS) else f"algo{a}",
                PROTOS[p] if p < len(PROTOS) else f"proto{p}",
                None,
                line,
            )
        elif m := _CHANNEL.search(line):
            transports.add(m.group(1))
        elif m := _ENV.search(line):
            env_seen[m.group(1)] = m.group(2)
    choices = {}
    for size in sorted(seen):
        (algo, proto, ch), _ = seen[size].most_common(1)[0]
        choices[str(size)] = {"algorithm": algo, "protocol": proto, "channels": ch}
    sym = {c["protocol"] for c in choices.values() if c["algorithm"] == "Symmetric"}
    return {
        "nccl_version": version.group(1) if version else None,
        "algorithms": sorted({c["algorithm"] for c in choices.values()}),
        "protocols": sorted({c["protocol"] for c in choices.values()} - sym),
        "choices": choices,
        "transports": sorted(transports),
        "nccl_env_read": env_seen,
        "nccl_debug_evidence": evidence,
    }
