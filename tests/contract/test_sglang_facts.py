"""The SGLang facts we own (spec_decode.core.drafter, spec_decode.engines.sglang), checked against the
installed 0.5.23 package's own source: its drafter EntryClass set, its layer-capture functions (run
here, extracted with ast: no torch import), the environment its launcher writes, its switches."""

import ast
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import pytest

from spec_decode.core import drafter
from spec_decode.engines import sglang

from .conftest import _absent

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def srt() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        _absent("sglang 0.5.23 not installed (.ci/install-sglang-contract.sh)")
    return Path(list(spec.submodule_search_locations)[0]) / "srt"


def entry_classes(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
            vals = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return [v.id for v in vals if isinstance(v, ast.Name)]
    return []


def function(path: Path, name: str, cls: str | None = None):
    """A function of SGLang's source, compiled on its own (its body needs only its arguments)."""
    tree = ast.parse(path.read_text())
    scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body if cls else tree.body
    fn = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    ns: dict = {"Optional": Optional, "List": List, "PretrainedConfig": object}
    exec(compile(ast.unparse(fn), str(path), "exec"), ns)
    return ns[name]


def test_eagle3_drafter_architectures_are_exactly_sglangs_entry_classes(srt):
    """A new EAGLE-3 drafter class in SGLang's EntryClass set fails here until core.drafter owns it."""
    found = {name: p.stem for p in (srt / "models").glob("*.py") for name in entry_classes(p) if "Eagle3" in name}
    assert found == drafter.ARCHITECTURES


def captured_by_sglang(path: Path, cls: str, ids, n: int):
    self = SimpleNamespace(
        pp_group=SimpleNamespace(is_last_rank=True),
        config=SimpleNamespace(num_hidden_layers=n),
        model=SimpleNamespace(),
    )
    function(path, "set_eagle3_layers_to_capture", cls)(self, ids)
    return self.model.layers_to_capture


@pytest.mark.parametrize(
    "module,cls,family",
    [("llama", "LlamaForCausalLM", drafter.LLAMA), ("deepseek_v2", "DeepseekV2ForCausalLM", drafter.DEEPSEEK)],
)
def test_capture_rule_per_family_is_sglangs_own(srt, module, cls, family):
    for ids in (None, [1, 29, 57], [0, 29, 57], [2, 30, 58], [1, 3, 4], [5, 1, 9]):
        assert captured_by_sglang(srt / "models" / f"{module}.py", cls, ids, 61) == drafter.captured_layers(
            ids, 61, family
        ), ids


def test_target_families_follow_sglangs_classes(srt):
    models = srt / "models"
    v3 = next(
        n
        for n in ast.parse((models / "deepseek_v2.py").read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "DeepseekV3ForCausalLM"
    )
    assert [b.id for b in v3.bases] == ["DeepseekV2ForCausalLM"]  # same capture rule
    kimi = (models / "kimi_k25.py").read_text()
    assert "self.language_model = DeepseekV3ForCausalLM(" in kimi
    assert "self.language_model.set_eagle3_layers_to_capture(layer_ids)" in kimi


def test_aux_layer_count_is_sglangs(srt):
    count = function(srt / "models" / "kimi_k25_eagle3.py", "_get_eagle_aux_layer_count")
    for dcfg in (
        {"eagle_config": {drafter.LAYER_IDS_KEY: [1, 29, 57]}},
        {"eagle_config": {drafter.LAYER_IDS_KEY: [1, 15, 29, 57]}},
        {"eagle_config": None},
        {drafter.LAYER_IDS_KEY: [1, 29]},
    ):
        full = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], **dcfg}
        assert count(SimpleNamespace(**dcfg)) == drafter.aux_layer_count(full), dcfg
    llama = (srt / "models" / "llama_eagle3.py").read_text()
    assert 'getattr(config, "num_aux_hidden_states", None)' in llama
    assert "len(layer_ids) if layer_ids else 3" in llama


def test_the_target_reads_layer_ids_only_from_eagle_config(srt):
    text = (srt / "model_executor" / "model_runner_components" / "spec_aux_hidden_state.py").read_text()
    assert (
        'config.eagle_aux_hidden_state_layer_ids = eagle_config[\n                "eagle_aux_hidden_state_layer_ids"'
        in text
    )


def test_launcher_env_writes_are_sglangs(srt):
    engine = (srt / "entrypoints" / "engine.py").read_text()
    for name in sglang.ENV_WRITES:
        assert re.search(rf'os\.environ\["{name}"\] = str\(\s*int\(', engine), name
    hook = (srt / "arg_groups" / "parallel_hook.py").read_text()
    assert f'os.environ.setdefault("{sglang.GRAPH_REGISTER[0]}", "{sglang.GRAPH_REGISTER[1]}")' in hook
    det = (srt / "arg_groups" / "attention_hook.py").read_text()
    assert f'os.environ["NCCL_ALGO"] = "{sglang.DETERMINISTIC_WRITES["NCCL_ALGO"]}"' in det
    assert (
        'os.environ["NCCL_MIN_NCHANNELS"] = nchannels' in det and 'os.environ["NCCL_MAX_NCHANNELS"] = nchannels' in det
    )
    env = (srt / "environ.py").read_text()
    assert f"SGLANG_DETERMINISTIC_NCCL_NCHANNELS = EnvInt({sglang.DETERMINISTIC_WRITES['NCCL_MAX_NCHANNELS']})" in env


def test_pcie_ipc_allreduce_switch_exists_and_is_off_by_default(srt):
    assert f"{sglang.PCIE_IPC_ALLREDUCE} = EnvBool(False)" in (srt / "environ.py").read_text()


def test_dead_flags_are_read_by_nothing(srt):
    """A flag leaves DEAD_FLAGS when SGLang starts reading it outside its argument definitions."""
    for flag in sglang.DEAD_FLAGS:
        field = flag.lstrip("-").replace("-", "_")
        users = [p.relative_to(srt) for p in srt.rglob("*.py") if field in p.read_text(errors="replace")]
        assert users and all(str(u).startswith("arg_groups/") for u in users), users
