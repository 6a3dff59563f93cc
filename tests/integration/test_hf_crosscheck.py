"""Our hand-written Llama equals Hugging Face's LlamaForCausalLM on the committed target, offline."""

import pytest
import torch

from spec_decode.engines.embedded.model import load_target
from spec_decode.engines.embedded.tokenizer import encode

from ..conftest import TARGET

pytestmark = pytest.mark.integration
transformers = pytest.importorskip("transformers")


def test_transformers_loads_the_target_and_agrees():
    hf = transformers.LlamaForCausalLM.from_pretrained(str(TARGET), local_files_only=True).eval()
    ours = load_target(TARGET)
    ids = torch.tensor([encode("The brave robot sleeps in the old house. The kind baker ")])
    with torch.no_grad():
        ref = hf(ids).logits[0]
        got, _ = ours(ids, ours.new_cache())
    assert (ref - got).abs().max().item() < 1e-4
    assert torch.equal(ref.argmax(-1), got.argmax(-1))


def test_tokenizer_files_are_byte_level_with_byte_ids():
    tok = transformers.AutoTokenizer.from_pretrained(str(TARGET), local_files_only=True)
    text = "The brave robot sleeps. Ünïcode too!"
    assert tok(text, add_special_tokens=False)["input_ids"] == encode(text)
    assert tok.decode(encode(text)) == text
