"""The record's sections that hold what another program answered, as types (issue 45): ``server_info`` (the
live server's /server_info: ``ServerInfo``), ``nccl_probe`` (the NCCL probe's result: ``NcclProbe``, an
``NcclSize`` per message size) and ``doctor`` (the self-check's live items: ``DoctorItem``).

The runner types each as it gets it (``runner.job``: the client's /server_info, ``probe.nccl.probe``'s dict;
``runner.doctor`` builds its items as ``DoctorItem``s). What the code reads of a payload is a typed field;
the keys it does not interpret stay in ``extra``. A payload is written back as it was read: its keys in
their order (``keys_read``), so a results.json does not change (``as_dict``); a key it lacked stays absent
(``ABSENT``), one it held null is written null.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from spec_decode.record.typed import ABSENT, Maybe, names, read, refuse, written

T = TypeVar("T")
NOT_JSON = {"json": False}  # a field that is no key of the JSON (typed.names leaves it out)


def _read(cls: type[T], data: Any) -> T:
    """``cls`` from a payload (``typed.read``), remembering its keys' order."""
    x = read(cls, data)
    x.keys_read = tuple(data)
    return x


def _in_order(obj: Any) -> dict:
    """A payload's JSON: every key it holds (ABSENT left out, None written null), in the order it was read;
    a key it did not have then after them."""
    d = written(obj, names(obj))
    return {**{k: d[k] for k in obj.keys_read if k in d}, **d}


@dataclass
class ServerInfo:
    """The engine's /server_info (the first launch's server, read once its timed runs are done): the
    engine's own payload, kept whole. What the record reads of it: ``version`` (the engine's release,
    the record's ``engine.version``; None where the engine sends none)."""

    version: str | None | Maybe = ABSENT
    extra: dict[str, Any] = field(default_factory=dict)  # every other key, as the engine sent it
    keys_read: tuple[str, ...] = field(default=(), repr=False, compare=False, metadata=NOT_JSON)

    def as_dict(self) -> dict:
        return _in_order(self)


def server_info_from(data: dict | None) -> ServerInfo | None:
    """A ``server_info`` section (or the engine's /server_info answer) -> typed; None when absent."""
    return _read(ServerInfo, data) if data is not None else None


@dataclass
class NcclSize:
    """One message size of the NCCL probe (``probe.nccl.combine``): eager per-call median/p90 (us, the
    slowest rank per round), with NCCL the device figures (None: no round in which the host was ahead)."""

    iters: int
    correct: bool  # every rank saw the right sum
    median_us: float
    p90_us: float
    rounds: int | Maybe = ABSENT
    device_rounds: int | Maybe = ABSENT  # NCCL only, as are the device figures
    device_median_us: float | None | Maybe = ABSENT
    device_p90_us: float | None | Maybe = ABSENT
    device_note: str | Maybe = ABSENT
    extra: dict[str, Any] = field(default_factory=dict)
    keys_read: tuple[str, ...] = field(default=(), repr=False, compare=False, metadata=NOT_JSON)

    def as_dict(self) -> dict:
        return _in_order(self)


@dataclass
class NcclProbe:
    """The NCCL probe's result (``probe.nccl.probe``, run before the job's server starts): the backend and
    its ranks' environment, per message size its figures (``sizes``: bytes as a string -> NcclSize) and,
    from the NCCL_DEBUG=INFO pass, the library's version and the algorithms and protocols it chose. A key
    the probe did not write (a gloo probe's NCCL facts) stays absent."""

    backend: str  # nccl | gloo
    world_size: int
    sizes: dict[str, NcclSize]
    env: dict[str, str] | Maybe = ABSENT  # the ranks' NCCL variables
    nccl_version: str | None | Maybe = ABSENT
    algorithms: list[str] | Maybe = ABSENT
    protocols: list[str] | Maybe = ABSENT
    correct: bool | Maybe = ABSENT  # every size on every rank
    extra: dict[str, Any] = field(default_factory=dict)  # iters, rounds, method, choices, transports, machine
    keys_read: tuple[str, ...] = field(default=(), repr=False, compare=False, metadata=NOT_JSON)

    def facts(self) -> dict:
        """What the provenance keeps of it (``provenance.nccl``): backend, version, algorithms, protocols
        (None where the probe did not say)."""
        return {k: (v if (v := getattr(self, k)) is not ABSENT else None) for k in NCCL_FACTS}

    def as_dict(self) -> dict:
        return {**_in_order(self), "sizes": {s: _size_json(s, v) for s, v in self.sizes.items()}}


def _size_json(size: str, v: Any) -> dict:
    refuse(f"nccl_probe.sizes[{size}]", v, NcclSize)  # a dict in its place is refused
    return v.as_dict()


NCCL_FACTS = ("backend", "nccl_version", "algorithms", "protocols")


def nccl_probe_from(data: dict | None) -> NcclProbe | None:
    """An ``nccl_probe`` section (or ``probe.nccl.probe``'s result) -> typed; None when absent."""
    if data is None:
        return None
    x = _read(NcclProbe, data)
    if not isinstance(x.sizes, dict):
        raise TypeError(f"nccl_probe.sizes: a JSON object expected, got {type(x.sizes).__name__}")
    x.sizes = {s: _read(NcclSize, v) for s, v in x.sizes.items()}
    return x


@dataclass
class DoctorItem:
    """One item of the self-check (``runner.doctor``): what was checked, whether it passed, what was seen and
    what to do when it did not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return written(self, names(DoctorItem))


def doctor_from(data: list | None) -> list[DoctorItem] | None:
    """A ``doctor`` section (the live items of the first launch's warmup request) -> typed; None when absent."""
    if data is None:
        return None
    if not isinstance(data, list):
        raise TypeError(f"doctor: a JSON array expected, got {type(data).__name__}")
    return [read(DoctorItem, x) for x in data]
