"""Golden SGLang log files (old and new shapes) parse to the right numbers."""

from pathlib import Path

import pytest

from spec_decode.parsers.decode_log import parse_line, read_log, summarize

pytestmark = pytest.mark.unit
LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def test_old_style_dot_tp0_trailing_comma():
    lines = read_log(LOGS / "sglang_0.5.4_tp0.log")
    assert [x.kind for x in lines] == ["Prefill", "Decode", "Decode"]
    d = lines[1]
    assert d.ranks == ["TP0"]
    assert d.fields["accept len"] == 2.17 and d.fields["accept rate"] == 0.54
    assert d.fields["cuda graph"] is True and d.fields["#queue-req"] == 0.0
    s = summarize(lines)
    # The first decode line after the prefill spans the idle gap (0.39 tok/s): dropped.
    assert (s.lines, s.used_lines) == (3 - 1, 1)
    assert s.gen_throughput_tok_s_median == 178.86
    assert s.accept_len_median == 1.95


def test_current_style_tp1_no_rank_tag():
    s = summarize(read_log(LOGS / "sglang_0.5.23_eagle3_tp1.log"))
    assert s.used_lines == 2
    assert s.gen_throughput_tok_s_median == pytest.approx((401.50 + 420.10) / 2)
    assert s.accept_len_median == pytest.approx(3.20)
    assert s.accept_rate_median == pytest.approx(0.565)
    assert s.graph is True


def test_npu_with_rank_tags():
    lines = read_log(LOGS / "sglang_npu_tp_ep.log")
    assert lines[1].ranks == ["TP0", "EP0"]
    assert lines[1].fields["npu graph"] is True
    assert summarize(lines).accept_len_median == 2.95


def test_milliseconds_and_iteration_counter_baseline():
    line = parse_line(
        "[2026-04-05 20:02:51.120] Decode batch [1200], #running-req: 32, #token: 11179, "
        "token usage: 0.08, cuda graph: True, gen throughput (token/s): 1635.11, #queue-req: 0"
    )
    assert line is not None and line.ts.microsecond == 120000
    assert "accept len" not in line.fields
    s = summarize(read_log(LOGS / "sglang_baseline_ms_iter.log"))
    assert s.accept_len_median is None


def test_other_lines_are_ignored():
    assert parse_line("[2026-10-20 12:00:00] The server is fired up and ready to roll!") is None
    assert parse_line("Decode batch, #running-req: 1") is None


def test_sglang_0_5_17_lines_from_the_first_real_run():
    """Verbatim lines of real SGLang 0.5.17 on the H200 (engines.sglang.SUPPORTED: the same Decode batch
    fields as 0.5.23): forced acceptance 2.0 at one step reads accept len 2.00, rate 1.00."""
    spec = read_log(LOGS / "sglang_0.5.17_eagle3_tp1_h200.log")
    assert [x.kind for x in spec] == ["Prefill", "Decode", "Decode", "Decode", "Decode", "Decode"]
    assert spec[1].ranks == [] and spec[1].fields["#token"] == 105.0
    s = summarize(spec)
    assert s.used_lines == 4  # the first decode line after the prefill spans the idle gap (4.89 tok/s)
    assert s.gen_throughput_tok_s_median == pytest.approx((346.97 + 346.53) / 2)
    assert (s.accept_len_median, s.accept_rate_median, s.graph) == (2.0, 1.0, True)
    base = summarize(read_log(LOGS / "sglang_0.5.17_baseline_tp1_h200.log"))
    assert base.accept_len_median is None and base.used_lines == 3
    assert base.gen_throughput_tok_s_median == 213.48  # the median of 213.48, 213.62, 213.42
