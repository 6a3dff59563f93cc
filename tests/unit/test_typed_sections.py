"""Record sections held as types, not dicts (issue 45): each reads from the JSON it always had and writes it
back byte for byte (results.json and metrics.json on disk do not change)."""

import json
from pathlib import Path

import pytest

from spec_decode.record import results
from spec_decode.record.results import Category, EngineInfo, JobRecord
from spec_decode.views.metrics_json import records_from_metrics, to_metrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = {
    "code": {"n": 4, "accept_len": 3.1, "throughput_tok_s": 410.0},
    "chat": {"n": 2, "accept_len": None, "throughput_tok_s": 350},  # a baseline: no counters; an int median
}


def test_categories_are_typed_and_results_json_is_rewritten_byte_for_byte(tmp_path):
    rec = JobRecord("spec", "spec.steps=2", "x", {"spec": {"steps": 2}}, "h", EngineInfo("embedded"), True)
    rec.categories = results.categories_from(CATEGORIES)
    assert rec.categories["code"] == Category(4, 3.1, 410.0) and rec.categories["chat"].accept_len is None
    path = results.write(tmp_path, rec)
    first = path.read_text()
    assert json.loads(first)["categories"] == CATEGORIES  # the JSON it always had, in its order
    back = results.read(tmp_path)
    assert back.categories == rec.categories
    back.record_id = "another"  # a second write of the same record is refused; the bytes are what count
    second = results.write(tmp_path / "again", back).read_text()
    assert second.replace('"another"', f'"{rec.record_id}"') == first


def test_metrics_json_keeps_the_categories_and_rebuilds_them_typed():
    metrics = json.loads((ROOT / "experiments" / "embedded_depth" / "metrics.json").read_text())
    recs = records_from_metrics(metrics)
    typed = [r for r in recs if r.categories]
    assert typed and all(isinstance(c, Category) for r in typed for c in r.categories.values())
    assert all("categories" not in r.extra for r in recs)
    again = to_metrics(recs)
    for key, e in metrics["jobs"].items():
        if "categories" in e:
            assert again["jobs"][key]["categories"] == e["categories"]
