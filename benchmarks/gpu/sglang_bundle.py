"""Build the SGLang bundle that benchmarks/gpu/sglang_route.sh installs on the lent H200 (issue 43).

The lent machine has Python 3.12, torch 2.11 (CUDA 13), triton 3.6 and no network; a device call carries
at most 64 MiB. SGLang 0.5.23 (what production runs) is cp311-only and pins torch 2.14.1: it cannot run
there. 0.5.11-0.5.17 pin torch 2.11.0; 0.5.17 ships a cp312 wheel. So the route is sglang 0.5.17 plus
only what the device lacks, trimmed to what a Hopper GPU and our launch flags load, in one xz tarball
(about 47 MiB) that one call carries beside the repository (docs/sglang-route.md says what was trimmed
and why it is safe).

    python benchmarks/gpu/sglang_bundle.py [--out .whl] [--cache /tmp/sglang-wheels]

Writes OUT/sglang-bundle.tar.xz (+ .sha256: the route script reinstalls only when it changes) and
OUT/runner/*.whl (hydra-core, omegaconf, antlr4, tabulate: what our runner needs beyond the device's
packages). Needs the network (PyPI) here; nothing is fetched on the device.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

# SGLang 0.5.17 and what the lent machine lacks (its packages: /work/.library/device/KINDS.md), resolved
# for cp312 on 2026-12-04 and pinned: what the server path imports at module level (an AST walk of its
# import closure from sglang.launch_server, the scheduler, EAGLEWorkerV2, the llama / llama_eagle3 models
# and the triton backend), plus each one's own requirements.
SGLANG = [
    "sglang==0.5.17",
    "sglang-kernel==0.4.5",  # sgl_kernel: 383 MB as shipped, 19 MB trimmed (below)
    "flashinfer-python==0.6.15.post1",  # imported on CUDA even with the triton backend
    "sgl-deep-gemm==0.1.5.post1",  # imported by dsa_backend while the draft's CUDA graphs are captured
    "xgrammar==0.2.1",  # imported by the function-call parsers even with --grammar-backend none
    "apache-tvm-ffi==0.1.11",
    "transformers==5.12.1",  # sglang's pin: the device's 5.17.0 breaks `import sglang` (a duplicate qwen3_asr config)
    "tokenizers==0.22.2",  # transformers 5.12.1 needs <= 0.23.0; the device has 0.23.2
    "compressed-tensors==0.20.1",
    "loguru==0.7.3",
    "gguf==0.19.0",
    "openai==2.6.1",
    "distro==1.9.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "fastapi==0.165.0",
    "starlette==1.10.0",
    "uvicorn==0.55.0",
    "python-multipart==0.0.34",
    "orjson==3.13.0",
    "msgspec==0.23.0",
    "pyzmq==27.3.0",
    "pybase64==1.5.1",
    "setproctitle==1.3.8",
    "partial-json-parser==0.2.1.1.post7",
    "zstandard==0.25.0",
    "dill==0.4.1",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "soundfile==0.13.1",
    "cffi==2.1.1",
    "pycparser==3.12",
    "opentelemetry-api==1.45.2",
    # sglang/utils.py imports IPython.display at module level (sglang/__init__ imports sglang.utils)
    "ipython==9.18.1",
    "ipython-pygments-lexers==1.1.1",
    "traitlets==5.16.1",
    "jedi==0.20.1",
    "parso==0.8.7",
    "prompt-toolkit==3.0.53",
    "wcwidth==0.9.4",
    "pexpect==4.9.0",
    "ptyprocess==0.7.0",
    "matplotlib-inline==0.2.2",
    "stack-data==0.6.3",
    "executing==2.3.0",
    "asttokens==3.0.2",
    "pure-eval==0.2.4",
]
RUNNER = ["hydra-core==1.3.8", "omegaconf==2.3.1", "antlr4-python3-runtime==4.9.3", "tabulate==0.10.0"]

# What is cut from the unpacked wheels, and why it is safe (each was checked against 0.5.17's source;
# the first real run, experiments/sglang_h200x1_dummy, loaded none of them).
TRIM = {
    "sgl_kernel/flash_ops.abi3.so": "FA3 (1.1 GB): only the fa3 attention backend imports it; we run triton",
    "sgl_kernel/sm100": "Blackwell's common_ops: sgl_kernel loads sm90/ on compute capability 9.0",
    "sgl_kernel/flashmla_ops.abi3.so": "FlashMLA (MLA models): its import is inside try/except",
    "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": "InfLLM-V2: loaded lazily by its backend only",
    "sglang/multimodal_gen": "the diffusion server, a separate entry point",
    "sglang/srt/server/_core.cpython-312-x86_64-linux-gnu.so": "the Rust HTTP server: only with SGLANG_RUST_SERVER",
    "sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so": "native gRPC: only with --grpc-port",
    "sglang/srt/multimodal/_core.cpython-312-x86_64-linux-gnu.so": "Inkling's Rust preprocessing: opt-in",
    "xgrammar/lib/libxgrammar.a": "a static library for C++ builds; Python loads libxgrammar_bindings.so",
    "jedi/third_party/typeshed": "type stubs for IPython's completion, never used by a server",
    "zstandard/_cffi.cpython-312-x86_64-linux-gnu.so": "the cffi backend; zstandard loads backend_c first",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 24, 26, 27, 28, 31, 34)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
]


def download(reqs: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", *plat, "-d", str(dest), *reqs]
    subprocess.run(cmd, check=True)


def wheel_of(req: str, cache: Path) -> Path:
    name, version = req.split("==")
    stem = name.replace("-", "_").lower()
    # pip may hold the same release under two platform tags (one per --platform it matched): any will do
    found = sorted(w for w in cache.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-"))
    if not found:
        raise SystemExit(f"{req}: no wheel in {cache}")
    return found[0]


def build_antlr(dest: Path) -> None:
    """antlr4-python3-runtime 4.9.3 (hydra's pin) exists only as an sdist: build its pure-Python wheel here."""
    if not list(dest.glob("antlr4_python3_runtime-4.9.3-*.whl")):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), RUNNER[2]], check=True
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".whl"), help="where the bundle goes (carry it: .whl)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/sglang-wheels"), help="downloaded wheels")
    ap.add_argument("--preset", type=int, default=9, help="xz preset (9: about 47 MiB, several minutes)")
    args = ap.parse_args(argv)

    download(SGLANG, args.cache)
    site = args.cache / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir()
    for req in SGLANG:
        with zipfile.ZipFile(wheel_of(req, args.cache)) as z:
            z.extractall(site)
    for rel, why in TRIM.items():
        p = site / rel
        if not p.exists():
            raise SystemExit(f"trim {rel}: not in the unpacked wheels (a new version? re-check: {why})")
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for cache_dir in site.rglob("__pycache__"):
        shutil.rmtree(cache_dir, ignore_errors=True)

    args.out.mkdir(parents=True, exist_ok=True)
    bundle = args.out / "sglang-bundle.tar.xz"
    with lzma.open(bundle, "wb", preset=args.preset) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for p in sorted(site.iterdir()):
            tar.add(p, arcname=p.name)
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    (args.out / "sglang-bundle.sha256").write_text(digest + "\n")

    runner = args.out / "runner"
    download([r for r in RUNNER if not r.startswith("antlr4")], runner)
    build_antlr(runner)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(
        f"{bundle}: {bundle.stat().st_size / 2**20:.1f} MiB (sha256 {digest[:12]}); {args.out} {size / 2**20:.1f} MiB"
    )
    print("trimmed: " + "; ".join(f"{k} ({v})" for k, v in TRIM.items()))


if __name__ == "__main__":
    main()
