"""The drafter rules of spec_decode.core.drafter against the config fixtures of real checkpoints
(tests/data/models: published config.json fields, no weights): architectures, aux-layer counts, the
per-family "ids in the checkpoint -> layers captured" rule, a nested text_config."""

import json
from pathlib import Path

import pytest

from spec_decode.core import drafter

pytestmark = pytest.mark.unit
MODELS = Path(__file__).resolve().parents[1] / "data" / "models"


def cfg(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


KIMI, MLA = cfg("kimi_k25"), cfg("kimi_k25_eagle3_mla")
LLAMA, LLAMA_EAGLE3 = cfg("llama3_8b_instruct"), cfg("llama3_8b_eagle3")


def test_both_published_pairs_pass():
    assert drafter.problems(MLA, KIMI, "mla") == []
    assert drafter.problems(LLAMA_EAGLE3, LLAMA, "llama") == []


def test_the_mla_drafter_is_an_architecture_sglang_loads_and_others_are_refused():
    assert "Eagle3DeepseekV2ForCausalLM" in drafter.ARCHITECTURES
    bad = {**MLA, "architectures": ["DeepseekV3ForCausalLM"]}
    [msg] = drafter.problems(bad, KIMI, "d/config.json")
    assert "DeepseekV3ForCausalLM" in msg and "Eagle3DeepseekV2ForCausalLM" in msg and "LlamaForCausalLMEagle3" in msg


def test_nested_text_config_is_read_for_layers_and_shapes():
    assert drafter.num_layers(KIMI) == 61 and drafter.language_model(KIMI)["hidden_size"] == 7168
    assert drafter.target_family(KIMI) == drafter.DEEPSEEK and drafter.target_family(LLAMA) == drafter.LLAMA
    wrong = json.loads(json.dumps(KIMI))
    wrong["text_config"]["hidden_size"] = 4096
    [msg] = drafter.problems(MLA, wrong, "d/config.json")
    assert "hidden size 7168 does not fit the target's 4096 (text_config.hidden_size)" in msg


def test_capture_rules_per_family():
    # none named: both families capture [2, n//2, n-3]
    assert drafter.captured_layers(None, 61, drafter.DEEPSEEK) == [2, 30, 58]
    assert drafter.captured_layers(None, 32, drafter.LLAMA) == [2, 16, 29]
    # Llama: +1 on every named id; DeepSeek: +1 only when the first id is 1
    assert drafter.captured_layers([0, 29, 57], 61, drafter.LLAMA) == [1, 30, 58]
    assert drafter.captured_layers([0, 29, 57], 61, drafter.DEEPSEEK) == [0, 29, 57]
    assert drafter.captured_layers([1, 29, 57], 61, drafter.DEEPSEEK) == [2, 30, 58]
    assert drafter.captured_layers([2, 30, 58], 61, drafter.DEEPSEEK) == [2, 30, 58]


def test_trained_vs_served_is_judged_by_captured_layers_of_the_target_family():
    served = {**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 29, 57]}}
    msg = drafter.trained_mismatch([1, 29, 57], [0, 29, 57], "d", KIMI)
    assert "captured layers [2, 30, 58]" in msg and "captured layers [0, 29, 57]" in msg
    assert any("acceptance would collapse" in m for m in drafter.problems(served, KIMI, "d", [1, 29, 57]))
    # [1, 29, 57] and [2, 30, 58] capture the same layers on a DeepSeek target, not on a Llama one
    assert drafter.trained_mismatch([1, 29, 57], [2, 30, 58], "d", KIMI) is None
    llama61 = {**LLAMA, "num_hidden_layers": 61}
    assert drafter.trained_mismatch([1, 29, 57], [2, 30, 58], "d", llama61) is not None
    # no ids named: the default capture equals what [1, n//2 - 1, n - 4] captures, on either family
    assert drafter.trained_mismatch([1, 15, 28], None, "d", LLAMA) is None
    assert drafter.trained_mismatch([1, 29, 57], None, "d", KIMI) is None


def test_captured_layers_must_exist_in_the_target():
    over = {**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 60]}}
    [msg] = drafter.problems(over, KIMI, "d")
    assert "captured layers [2, 30, 61]" in msg and "layers 0..60" in msg
    # on DeepSeek, an id of 60 is fine when the first id is not 1 (no +1)
    assert drafter.problems({**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 29, 60]}}, KIMI, "d") == []


def test_aux_layer_count_comes_from_the_checkpoint():
    assert drafter.aux_layer_count(LLAMA_EAGLE3) == 3  # names none
    four = {**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 29, 57]}}
    assert drafter.aux_layer_count(four) == 4 and drafter.problems(four, KIMI, "d") == []
    mla_top = {**MLA, "eagle_config": None, "eagle_aux_hidden_state_layer_ids": [1, 29]}
    assert drafter.aux_layer_count(mla_top) == 2
    # it reads 2 layers but the target captures the default 3: refused
    assert any("reads 2" in m for m in drafter.problems(mla_top, KIMI, "d"))
    assert drafter.aux_layer_count({**LLAMA_EAGLE3, "num_aux_hidden_states": 4}) == 4
