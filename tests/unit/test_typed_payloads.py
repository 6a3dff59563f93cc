"""The record's sections that hold another program's answer, as types (issue 45: record.payloads): the
engine's /server_info, the NCCL probe's result and the doctor's live items. Each reads the JSON it always
had and writes it back byte for byte (the payload's keys in their order); a dict in a type's place is
refused at the write."""

import json
import re

import pytest

from spec_decode.analysis import sections
from spec_decode.probe.nccl import combine
from spec_decode.record import results
from spec_decode.record.payloads import DoctorItem, NcclProbe, NcclSize, ServerInfo, nccl_probe_from, server_info_from
from spec_decode.record.provenance import Provenance
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.record.typed import ABSENT
from spec_decode.runner import doctor

pytestmark = pytest.mark.unit

# the embedded engine's /server_info: its version in the middle of the engine's own keys
SERVER_INFO = {
    "model_path": "models/tiny",
    "tp_size": 1,
    "tokenizer_path": "models/tiny",
    "version": "0.5.23",
    "engine": "embedded",
    "cuda_graph_error": None,
    "internal_states": [{"avg_spec_accept_length": 2.5}],
}
RANKS = [  # probe.nccl.combine's input: one rank's rounds per size
    {
        "sizes": {
            "4096": {"eager_us": [9.0, 8.0, 7.0], "correct": True, "host_ahead": [True] * 3, "device_us": [5.0] * 3},
            "65536": {"eager_us": [19.0] * 3, "correct": True, "host_ahead": [False] * 3, "device_us": [9.0] * 3},
        }
    }
]


def probe_result(backend: str) -> dict:
    """What probe.nccl.probe returns, in its order (the NCCL_DEBUG pass's keys only with NCCL)."""
    out = {"backend": backend, "world_size": 2, "env": {"NCCL_PROTO": "LL"}, "iters": 3, "rounds": 3}
    out.update(method={"eager": "wall clock", "device": None}, sizes={})
    if backend == "nccl":
        out.update(nccl_version="2.27.3", algorithms=["Ring"], protocols=["LL"], choices={}, transports=["P2P"])
    out["machine"] = {"gpu": None}
    out["sizes"] = combine(RANKS, [4096, 65536], 3, 3, backend)
    out["correct"] = True
    return out


def record() -> JobRecord:
    rec = JobRecord("spec", "spec.steps=2", "x", {"spec": {"steps": 2}}, "h", EngineInfo("embedded"), True)
    rec.server_info = server_info_from(json.loads(json.dumps(SERVER_INFO)))
    rec.nccl_probe = nccl_probe_from(probe_result("nccl"))
    rec.doctor = [
        doctor.Item("profile from rank 0", True, "3 lines"),
        doctor.Item("decode log", False, "no line", "run with --log-level info"),
    ]
    return rec


def rewritten(tmp_path, rec: JobRecord) -> tuple[dict, JobRecord, str, str]:
    first = results.write(tmp_path / "a", rec).read_text()
    back = results.read(tmp_path / "a")
    back.record_id = "another"
    second = results.write(tmp_path / "b", back).read_text().replace('"another"', f'"{rec.record_id}"')
    return json.loads(first), back, first, second


def test_the_payloads_are_typed_and_results_json_keeps_their_keys_in_their_order(tmp_path):
    rec = record()
    d, back, first, second = rewritten(tmp_path, rec)
    assert second == first
    assert d["server_info"] == SERVER_INFO and list(d["server_info"]) == list(SERVER_INFO)
    assert d["nccl_probe"] == probe_result("nccl") and list(d["nccl_probe"]) == list(probe_result("nccl"))
    assert list(d["nccl_probe"]["sizes"]["65536"]) == list(probe_result("nccl")["sizes"]["65536"])
    assert d["doctor"][1] == {
        "name": "decode log",
        "ok": False,
        "detail": "no line",
        "fix": "run with --log-level info",
    }
    assert isinstance(back.server_info, ServerInfo) and back.server_info.version == "0.5.23"
    assert isinstance(back.nccl_probe.sizes["4096"], NcclSize) and back.nccl_probe.sizes["4096"].device_median_us == 5.0
    assert back.nccl_probe.sizes["65536"].device_median_us is None  # no round with the host ahead: null
    assert all(isinstance(x, DoctorItem) for x in back.doctor) and back.doctor == rec.doctor
    assert back.server_info.extra["internal_states"] == SERVER_INFO["internal_states"]


def test_a_gloo_probe_and_an_older_one_keep_their_keys_and_say_what_they_lack():
    gloo = probe_result("gloo")
    p = nccl_probe_from(gloo)
    assert p.as_dict() == gloo and list(p.as_dict()) == list(gloo) and p.nccl_version is ABSENT
    assert "device_median_us" not in p.as_dict()["sizes"]["4096"] and p.sizes["4096"].device_median_us is ABSENT
    assert p.facts() == {"backend": "gloo", "nccl_version": None, "algorithms": None, "protocols": None}
    assert set(sections.nccl_metrics(p)) == {"nccl_allreduce_us_4096", "nccl_allreduce_us_65536"}
    first = {  # the first probe's shape (no rounds, no method), in its order
        "backend": "gloo",
        "world_size": 2,
        "env": {},
        "sizes": {"4096": {"median_us": 9.0, "p90_us": 9.5, "correct": True, "iters": 50}},
        "correct": True,
    }
    assert json.dumps(nccl_probe_from(first).as_dict()) == json.dumps(first)


def test_the_engine_version_and_the_provenance_come_from_the_typed_payloads():
    rec = record()
    section = sections.nccl_section(rec.nccl_probe, Provenance())
    assert section.fields["provenance"].nccl == {
        "backend": "nccl",
        "nccl_version": "2.27.3",
        "algorithms": ["Ring"],
        "protocols": ["LL"],
    }
    assert section.metrics == {
        "nccl_allreduce_us_4096": 8.0,
        "nccl_allreduce_us_65536": 19.0,
        "nccl_allreduce_device_us_4096": 5.0,
    }
    assert server_info_from({"engine": "embedded"}).as_dict() == {"engine": "embedded"}  # no version: none written


def test_a_record_without_them_writes_them_null(tmp_path):
    rec = JobRecord("spec", "x", "x", {}, "h", EngineInfo("embedded"), True)
    d = rewritten(tmp_path, rec)[0]
    assert [d[k] for k in ("server_info", "nccl_probe", "doctor")] == [None, None, None]


PLANTS = {
    "server_info": lambda r: setattr(r, "server_info", dict(SERVER_INFO)),
    "nccl_probe": lambda r: setattr(r, "nccl_probe", probe_result("nccl")),
    "nccl_probe.sizes": lambda r: r.nccl_probe.sizes.update({"8": r.nccl_probe.sizes["4096"].as_dict()}),
    "doctor": lambda r: r.doctor.append({"name": "x", "ok": True, "detail": "", "fix": ""}),
}


@pytest.mark.parametrize("where", PLANTS)
def test_a_payload_of_another_type_is_refused_at_the_write(tmp_path, where):
    """A writer that puts the old dict back where the type belongs fails the write (not a silent dict)."""
    rec = record()
    PLANTS[where](rec)
    with pytest.raises(TypeError, match=re.escape(where)):
        results.write(tmp_path, rec)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("server_info", lambda d: [d]),
        ("nccl_probe", lambda d: {k: v for k, v in d.items() if k != "sizes"}),  # without its sizes
        ("nccl_probe", lambda d: {**d, "sizes": [1, 2]}),
        ("nccl_probe", lambda d: {**d, "sizes": {"8": {"median_us": 1.0}}}),  # a size without its figures
        ("doctor", lambda d: {"name": "x"}),  # not a list
        ("doctor", lambda d: [{"name": "x", "detail": "y"}]),  # an item without its verdict
    ],
)
def test_a_results_json_with_a_misshapen_payload_does_not_read(tmp_path, name, bad):
    d = json.loads(json.dumps(record().to_dict()))
    with pytest.raises(TypeError):
        JobRecord.from_dict({**d, name: bad(d[name])})
    assert JobRecord.from_dict(d).to_dict() == d
    assert isinstance(JobRecord.from_dict(d).nccl_probe, NcclProbe)
