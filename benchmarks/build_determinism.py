"""Do the model builds give the same bits on CPUs with other instruction sets?

    python benchmarks/build_determinism.py                       # small recipe, every setting x CPU
    python benchmarks/build_determinism.py --recipe full --settings pinned --cpus native,avx2

We have one CPU model here, so other CPUs are *emulated* on it: each "CPU" caps the instruction set
that every ISA-dispatching library of the build may use --
  ATen kernels   ATEN_CPU_CAPABILITY (torch's own override: avx512 / avx2 / default)
  MKL (BLAS)     MKL_ENABLE_INSTRUCTIONS (MKL's cap: AVX512 / AVX2 / SSE4_2)
  glibc libm     GLIBC_TUNABLES=glibc.cpu.hwcaps=-... (masks AVX-512 / AVX2 / FMA for ifunc selection)
(oneDNN is linked but runs no primitive in these builds: ONEDNN_VERBOSE=1 prints none).

Each setting then runs the three builds (target, drafter_data, drafter) once per emulated CPU, in a
fresh directory, as subprocesses with exactly that environment, and the table gives the weights'
sha256, the target's final loss, the drafter's held-out accept length at 2 steps and the CPU seconds
per stage (target / drafter_data / drafter). Settings:
  as_is     --kernels native: fixed threads + deterministic algorithms, kernels as the CPU
            dispatches them (how the committed models were built)
  pinned    --kernels pinned (spec_decode/engines/embedded/kernels.py): the build re-executes itself
            with kernels.PINNED_ENV, which overrides the emulated CPU's ATen capability
The same emulated CPU in two settings differs only in the setting. Agreement across emulated CPUs is
evidence, not proof, for real other CPUs: it covers ISA dispatch in ATen, MKL and libm, not e.g. a
different MKL/torch build or microcode.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spec_decode.engines.embedded import kernels  # noqa: E402

# name -> (ATen capability, MKL cap, glibc hwcaps mask); "native" = nothing capped
CPUS = {
    "native": {},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512DQ,-AVX512BW,-AVX512VL,-AVX512CD",
    },
    "sse42": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512DQ,-AVX512BW,-AVX512VL,-AVX512CD,"
        "-AVX2,-FMA,-AVX,-BMI1,-BMI2",
    },
}
SETTINGS = {"as_is": "native", "pinned": "pinned"}  # setting -> the builds' --kernels
# Small: the full recipe's shapes (so BLAS picks the same kernels) with fewer steps and samples.
RECIPES = {
    "small": {
        "target": ["--steps", "12", "--batch", "2", "--seq", "256"],
        "data": ["--samples", "8", "--heldout", "4", "--seq", "256", "--prompt-tokens", "32"],
        "drafter": ["--steps", "12", "--batch", "2"],
    },
    "full": {
        "target": ["--steps", "300", "--batch", "6", "--seq", "640"],
        "data": ["--samples", "256", "--heldout", "16", "--seq", "640", "--prompt-tokens", "64"],
        "drafter": ["--steps", "300", "--batch", "3"],
    },
}
SHAPE = ["--hidden", "192", "--layers", "6", "--heads", "8", "--ffn", "512"]  # params.yaml build.target


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_stage(module: str, args: list[str], env: dict, cwd: Path) -> float:
    """CPU seconds (user + sys) the stage's process used: on a shared machine its wall time measures
    the neighbours more than the kernels."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{module} {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def build_all(work: Path, corpus: Path, recipe: dict, env: dict, mode: str) -> dict:
    m = "spec_decode.engines.embedded."
    k = ["--kernels", mode]
    t, d, dr = work / "target", work / "data", work / "drafter"
    s_t = run_stage(
        m + "build",
        ["target", "--corpus", str(corpus), "--out", str(t), "--threads", "2", *SHAPE, *recipe["target"], *k],
        env,
        work,
    )
    s_d = run_stage(
        m + "drafter_data",
        ["--corpus", str(corpus), "--target", str(t), "--out", str(d), "--threads", "2", *recipe["data"], *k],
        env,
        work,
    )
    s_dr = run_stage(
        m + "build",
        [
            "drafter",
            "--data",
            str(d),
            "--target",
            str(t),
            "--out",
            str(dr),
            "--threads",
            "2",
            "--layer-ids",
            "1,3,4",
            "--mlflow-uri",
            "off",
            *recipe["drafter"],
            *k,
        ],
        env,
        work,
    )
    trec = json.loads((t / "training.json").read_text())
    drec = json.loads((dr / "training.json").read_text())
    return {
        "target_sha": sha(t / "model.safetensors"),
        "data_sha": sha(d / "samples.safetensors"),
        "drafter_sha": sha(dr / "model.safetensors"),
        "loss": trec["final_loss"],
        "accept2": drec["heldout"]["accept_len"][1],
        "target_cpu_s": s_t,
        "data_cpu_s": s_d,
        "drafter_cpu_s": s_dr,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="small")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {sorted(SETTINGS)}")
    ap.add_argument("--cpus", default="avx512,avx2,sse42", help=f"comma list of {sorted(CPUS)}")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    from spec_decode.engines.embedded.corpus import build_corpus

    rows = []
    with tempfile.TemporaryDirectory(prefix="build-determinism-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(build_corpus(1234, 2_000_000 if args.recipe == "full" else 200_000))
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in {"ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "GLIBC_TUNABLES", *kernels.PINNED_ENV}
        }
        base["PYTHONPATH"] = str(ROOT)
        for setting in args.settings.split(","):
            for i, cpu in enumerate(args.cpus.split(",")):
                work = Path(tmp) / f"{setting}-{cpu}-{i}"
                work.mkdir()
                r = build_all(work, corpus, RECIPES[args.recipe], {**base, **CPUS[cpu]}, SETTINGS[setting])
                rows.append({"setting": setting, "cpu": cpu, **r})
                print(
                    f"{setting:7s} {cpu:7s} target {r['target_sha'][:12]} loss {r['loss']:.4f} "
                    f"data {r['data_sha'][:12]} drafter {r['drafter_sha'][:12]} accept@2 {r['accept2']:.4f} "
                    f"| CPU s {r['target_cpu_s']:.0f} / {r['data_cpu_s']:.0f} / {r['drafter_cpu_s']:.0f}",
                    flush=True,
                )
    print(f"\nrecipe {args.recipe}; emulated CPUs: {args.cpus}")
    for setting in args.settings.split(","):
        own = [r for r in rows if r["setting"] == setting]
        same = {k: len({r[k] for r in own}) == 1 for k in ("target_sha", "data_sha", "drafter_sha")}
        loss = [r["loss"] for r in own]
        acc = [r["accept2"] for r in own]
        secs = [r["target_cpu_s"] + r["data_cpu_s"] + r["drafter_cpu_s"] for r in own]
        print(
            f"{setting:7s} bit-identical across CPUs: target {same['target_sha']}, data {same['data_sha']}, "
            f"drafter {same['drafter_sha']}; loss spread {max(loss) - min(loss):.4f}, accept@2 spread "
            f"{max(acc) - min(acc):.4f}; CPU s per build {', '.join(f'{s:.0f}' for s in secs)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
