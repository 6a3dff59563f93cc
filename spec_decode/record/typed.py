"""What the record's typed sections share (issue 45): how a section writes its fields (``written``) and
reads them back (``read``), and ``ABSENT``: a key the JSON does not have, where None is a key written null.

A section whose keys come and go (a launch without a paired server, the profiled pass before the
profiler's effect is added) holds None for a key it does not have (``written`` leaves it out) unless
the key can be present and null too: then the field defaults to ``ABSENT`` (left out) and None is
written null.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class Absent(enum.Enum):
    """A key absent from the JSON (one instance, falsy: ``if x.effect`` reads absent and null alike)."""

    ABSENT = "absent"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent.ABSENT
Maybe = Literal[Absent.ABSENT]  # a field's annotation: ``dict | None | Maybe``


def names(cls: Any) -> tuple[str, ...]:
    """A section's field names, in order, but ``extra`` and a field that is no key of its JSON (its metadata
    ``{"json": False}``: a payload's key order, ``record.payloads``)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra" and f.metadata.get("json", True))


def written(obj: Any, keep: tuple[str, ...] = ()) -> dict:
    """The fields that are set, in field order, then ``extra``: ABSENT is left out, and None too but for
    the fields in ``keep`` (written null)."""
    out = {k: v for k in names(obj) if (v := getattr(obj, k)) is not ABSENT and (v is not None or k in keep)}
    return {**out, **getattr(obj, "extra", {})}


def read(cls: type[T], data: Any) -> T:
    """``cls`` from its JSON object: its own fields by name (a required one missing: TypeError), the other
    keys into ``extra``."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: a JSON object expected, got {type(data).__name__}")
    own = set(names(cls))
    return cls(**{k: v for k, v in data.items() if k in own}, extra={k: v for k, v in data.items() if k not in own})


def refuse(name: str, value: Any, cls: type) -> None:
    """A section of another type (a dict where the type belongs) is refused at the write."""
    if not isinstance(value, cls):
        raise TypeError(f"record section {name}: a {cls.__name__} expected, got {type(value).__name__}")
