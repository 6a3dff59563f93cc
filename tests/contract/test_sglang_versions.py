"""Every row of engines.sglang.SUPPORTED re-read from that release's own source, for each release: 0.5.23
as pip installs it, 0.5.17 as .ci/install-sglang-contract.sh unpacks its cp312 wheel (its .py files) into
<venv>/sglang-0.5.17. Source only (ast and text): 0.5.17's parser imports GPU-only packages at module level
(triton kernels, torchvision), so its argv parse runs on the H200, not here (README, Supported SGLang
versions). What is checked per release: the flags our argv generator emits are defined, the meta_info
keys the client reads are written, the Decode batch line's fields, the EAGLE worker and our profiler's
hook targets, the overlap default, the forced-acceptance env names, the launcher's env writes."""

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from spec_decode.core.config import register_configs, to_experiment
from spec_decode.engines import server_command
from spec_decode.engines.sglang import META_INFO_KEYS, SUPPORTED
from spec_decode.runner.client import Client
from spec_decode.runner.doctor import check_hook_targets

from .conftest import _absent

pytestmark = pytest.mark.contract
CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def source_root(release: str) -> Path | None:
    """The directory holding that release's ``sglang/`` package, or None when it is not installed."""
    if release == "0.5.17":
        root = Path(sys.prefix) / "sglang-0.5.17"
        return root if (root / "sglang" / "srt" / "server_args.py").is_file() else None
    from importlib.metadata import PackageNotFoundError, version

    spec = importlib.util.find_spec("sglang")
    try:
        installed = version("sglang")
    except PackageNotFoundError:
        installed = None
    if spec is None or not spec.submodule_search_locations or installed != release:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


@pytest.fixture(params=sorted(SUPPORTED), scope="module")
def release(request):
    root = source_root(request.param)
    if root is None:
        _absent(f"sglang {request.param}'s source is not installed (.ci/install-sglang-contract.sh)")
    return SUPPORTED[request.param], root / "sglang" / "srt", root


def read(srt: Path, rel: str) -> str:
    return (srt / rel).read_text()


def defined_flags(srt: Path) -> set[str]:
    """Every ``--flag`` SGLang's parser defines: the option strings in server_args.py and arg_groups/,
    and the fields its dataclass-driven parser turns into flags (``name: A[...]`` -> ``--name``)."""
    text = read(srt, "server_args.py") + "".join(p.read_text() for p in (srt / "arg_groups").rglob("*.py"))
    flags = set(re.findall(r'"(--[a-z0-9][a-z0-9-]*)"', text))
    fields = re.findall(r"^    ([a-z_][a-z0-9_]*): A\[", text, re.M)
    return flags | {"--" + f.replace("_", "-") for f in fields}


def our_sglang_argvs() -> list[list[str]]:
    """One argv per hardware profile x (spec, baseline), with the load-axis caps: every flag we emit."""
    out = []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for hw in ("h200x1", "h200x8", "rtx_pro_6000x8"):
            for drafter in ("tiny_eagle3", "none"):
                cfg = compose(
                    "config",
                    overrides=[
                        "engine=sglang",
                        f"hardware={hw}",
                        f"drafter={drafter}",
                        "engine.max_running_requests=32",
                        "engine.cuda_graph_max_bs_decode=32",
                    ],
                )
                out.append(server_command(to_experiment(cfg), 30000)[3:])
    return out


def test_every_flag_we_emit_is_defined_by_the_release(release):
    rel, srt, _ = release
    flags = defined_flags(srt)
    ours = {a for argv in our_sglang_argvs() for a in argv if a.startswith("--")}
    assert rel.graph_cap_flag in ours and rel.graph_cap_flag in flags
    assert ours <= flags, sorted(ours - flags)
    assert not ours & set(rel.refused_flags)
    assert "--speculative-num-stepz" not in flags  # the reader finds definitions, not any dashed word


def test_meta_info_spec_keys_are_the_releases_and_hold_what_we_read(release):
    rel, srt, _ = release
    written = set(re.findall(r'meta_info\["(spec_[a-z_]+)"\] =', read(srt, "managers/tokenizer_manager.py")))
    assert written == rel.meta_info_spec_keys
    assert set(META_INFO_KEYS) <= written
    assert re.search(
        r'"completion_tokens": recv_obj\.completion_tokens\[i\]', read(srt, "managers/tokenizer_manager.py")
    )


def test_the_decode_batch_line_has_the_fields_our_parser_reads(release):
    _, srt, _ = release
    text = read(srt, "managers/scheduler_components/metrics_reporter.py")
    assert 'msg = f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"' in text
    for piece in (
        'msg += f"accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, "',
        'f"{self._graph_backend_label}: {can_run_cuda_graph}, "',
        'f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "',
    ):
        assert piece in text, piece


def test_eagle3_runs_the_worker_our_profiler_hooks(release):
    rel, srt, root = release
    module, cls = rel.spec_worker.rsplit(".", 1)
    spec_info = read(srt, "speculative/spec_info.py")
    assert f"from sglang.srt.{module} import {cls}\n\n            return {cls}" in spec_info
    item = check_hook_targets("sglang", root=root)
    assert item.ok, item.detail


def test_the_overlap_scheduler_default_is_the_releases(release):
    rel, srt, _ = release
    text = read(srt, "server_args.py") + "".join(p.read_text() for p in (srt / "arg_groups").rglob("*.py"))
    m = re.search(r"    disable_overlap_schedule: A\[.*?\n    \] = (True|False)\n", text, re.S)
    assert m is not None and (m[1] == "False") == rel.overlap_default_on


def test_forced_acceptance_names_are_the_releases(release):
    rel, srt, _ = release
    env = read(srt, "environ.py")
    for name in rel.simulate_acc_env:
        assert re.search(rf"^    {name} = Env", env, re.M), name


def test_launcher_env_writes_are_the_releases(release):
    rel, srt, _ = release
    engine = read(srt, "entrypoints/engine.py")
    lines = engine.splitlines()
    for name, (_, where) in rel.env_writes.items():
        first, last = (int(x) for x in re.search(r"(\d+)-(\d+)", where).groups())
        span = "\n".join(lines[first - 1 : last])
        assert f'os.environ["{name}"] = str(' in span and "int(" in span, (name, where, span)
    name, where = rel.run_id_env
    line = int(re.search(r"(\d+)-", where)[1])
    assert f'os.environ["{name}"] = (' in lines[line - 1], (where, lines[line - 1])
    everything = "".join(p.read_text() for p in srt.rglob("*.py"))
    assert (rel.graph_register is not None) == ("NCCL_GRAPH_REGISTER" in everything)
    assert (rel.pcie_ipc_allreduce is not None) == ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in everything)
    assert ("NCCL_MAX_NCHANNELS" in rel.deterministic_writes) == ('os.environ["NCCL_MAX_NCHANNELS"]' in everything)
    assert 'os.environ["NCCL_ALGO"] = "allreduce:tree"' in everything


def test_our_generate_body_fits_the_releases_sampling_params(release):
    """0.5.17 has no api/v1/api_types.py: /generate builds its SamplingParams (a msgspec Struct,
    kw_only: an unknown key is refused) from sampling_params; 0.5.23's has the same shape."""
    _, srt, _ = release
    tree = ast.parse(read(srt, "sampling/sampling_params.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SamplingParams")
    assert any(k.arg == "kw_only" and getattr(k.value, "value", None) is True for k in cls.keywords)
    params = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    body = Client("http://x", 1).generate_body("The robot sleeps. ", 500, 0.0, True)
    assert set(body["sampling_params"]) <= params, set(body["sampling_params"]) - params
    assert "max_tokens" not in params


def test_the_plugin_loader_and_hook_registry_are_the_same_code_in_every_release():
    """Our plugin registers through SGLang's HookRegistry, run for real against 0.5.23 only
    (test_sglang_contract.py: importing 0.5.17's sglang package needs its GPU stack). That run covers
    0.5.17 because its loader and registry are the same code (ast-equal: 0.5.17 differs by one line
    break); a release whose registry differs fails here until the registry test runs against it."""
    roots = {v: source_root(v) for v in SUPPORTED}
    for v, root in roots.items():
        if root is None:
            _absent(f"sglang {v}'s source is not installed (.ci/install-sglang-contract.sh)")
    for rel in ("srt/plugins/hook_registry.py", "srt/plugins/__init__.py"):
        dumps = {v: ast.dump(ast.parse((root / "sglang" / rel).read_text())) for v, root in roots.items()}
        assert len(set(dumps.values())) == 1, f"{rel} differs between releases {sorted(dumps)}"
