"""Record sections held as types, not dicts (issue 45): each reads from the JSON it always had and writes it
back byte for byte (results.json and metrics.json on disk do not change)."""

import json
from pathlib import Path

import pytest

from spec_decode.record import results
from spec_decode.record.results import Category, EngineInfo, JobRecord, Lossless
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


LOSSLESS = {  # the load guard's verdict: the one with ``what``
    "checked": True,
    "requests": 8,
    "matched": 7,
    "match_rate": 0.875,
    "first_divergence": {"load:3": 17},
    "verdict": "fail",
    "reason": "1 of 8 outputs differ from the baseline's",
    "what": "every request under load vs the baseline's output of its prompt at bs 1",
}


@pytest.mark.parametrize("what", [True, False])
def test_lossless_is_typed_and_results_json_is_rewritten_byte_for_byte(tmp_path, what):
    data = dict(LOSSLESS) if what else {k: v for k, v in LOSSLESS.items() if k != "what"}
    rec = JobRecord("spec", "spec.steps=2", "x", {"spec": {"steps": 2}}, "h", EngineInfo("embedded"), True)
    rec.lossless = results.lossless_from(data)
    assert isinstance(rec.lossless, Lossless) and rec.lossless.first_divergence == {"load:3": 17}
    path = results.write(tmp_path, rec)
    first = path.read_text()
    assert list(json.loads(first)["lossless"].items()) == list(data.items())  # its keys, in their order
    back = results.read(tmp_path)
    assert back.lossless == rec.lossless
    back.record_id = "another"
    assert results.write(tmp_path / "again", back).read_text().replace('"another"', f'"{rec.record_id}"') == first
    # a record without a verdict (a refused job) keeps writing {} as before
    empty = JobRecord("spec", "x", "x", {}, "h", EngineInfo("embedded"), True)
    assert empty.lossless is None and json.loads(results.write(tmp_path / "empty", empty).read_text())["lossless"] == {}


def test_metrics_json_keeps_the_lossless_verdicts_and_rebuilds_them_typed():
    metrics = json.loads((ROOT / "experiments" / "embedded_concurrency" / "metrics.json").read_text())
    recs = records_from_metrics(metrics)
    typed = [r for r in recs if r.lossless is not None]
    assert typed and all(isinstance(r.lossless, Lossless) for r in typed)
    assert all("lossless" not in r.extra for r in recs)
    again = to_metrics(recs)
    for key, e in metrics["jobs"].items():
        if "lossless" in e:
            assert again["jobs"][key]["lossless"] == e["lossless"]
