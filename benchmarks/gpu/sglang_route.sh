#!/usr/bin/env bash
# Real SGLang on the lent H200 (issue 43): install the trimmed SGLang bundle that
# benchmarks/gpu/sglang_bundle.py built here, then run our runner against it. Run from the repository
# root, the bundle in .whl/ (carry: [".whl"]):
#
#   bash benchmarks/gpu/sglang_route.sh STEPS [run.py overrides...]
#     STEPS, comma-separated, in the order given:
#       install   unpack .whl/sglang-bundle.tar.xz into $SITE (skipped when a finished install is there),
#                 the runner's wheels (.whl/runner/*.whl), what the bundle lacks (.whl/extra/*.whl: deep_gemm)
#                 and our entry point
#       check     python -c "import sglang.srt.server_args, sgl_kernel" and friends, the doctor's static items
#       synthetic the 8B-shaped target + EAGLE-3 drafter configs and weights (spec_decode build synthetic)
#       job       one point of the experiment (e.g. spec.steps=3) through python run.py -m, engine=sglang
#       sweep     python run.py -m experiment=sglang_h200x1_dummy tracking=off [overrides]
#   e.g.  bash benchmarks/gpu/sglang_route.sh install,check,synthetic,job spec.steps=3
#
# What comes back lands in $OUT: <step>.log, job.tgz / sweep.tgz (the Hydra dirs: results.json,
# server.log, profile.jsonl; extract at the repo root, then python -m spec_decode.tracking sync <dir>).
# Every step runs under `timeout`, the whole call under SESSION_BUDGET_S (default 560 s).
set -u -o pipefail
STEPS=${1:-install,check}
shift || true
OUT=${OUT:-$PWD/gpu_out}
SITE=${SESSION_SITE:-/tmp/sgl_site}
PY=${PYTHON:-python3}
BUDGET_S=${SESSION_BUDGET_S:-560}
mkdir -p "$OUT"
# The lent machine's rule (KINDS.md): NVLink multicast stays off in every NCCL process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

left() { echo $((BUDGET_S - SECONDS)); }
bounded() {
  local t=$1; shift
  local rest=$(( $(left) - 15 ))
  [ "$rest" -lt "$t" ] && t=$rest
  if [ "$t" -le 5 ]; then echo "[route] no time left for: $*"; return 124; fi
  timeout -s INT -k 30 "$t" "$@"
}

step_install() {
  if [ -f "$SITE/.route-complete" ] && cmp -s "$SITE/.route-complete" .whl/sglang-bundle.sha256; then
    echo "[route] $SITE already holds this bundle"; return 0
  fi
  rm -rf "$SITE" && mkdir -p "$SITE"
  local t0=$SECONDS
  # Python's own lzma: no dependence on the machine's xz.
  "$PY" -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='fully_trusted')" \
    .whl/sglang-bundle.tar.xz "$SITE" || return 1
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/runner/*.whl $(ls .whl/extra/*.whl 2>/dev/null) || return 1
  # Our entry point (sglang.srt.plugins -> spec_decode_profiler): a dist-info on the path is enough (the
  # code is imported from the repository, on PYTHONPATH).
  local di="$SITE/spec_decode_bench-0.0.0.dist-info"
  mkdir -p "$di" && printf 'Metadata-Version: 2.1\nName: spec-decode-bench\nVersion: 0.0.0\n' > "$di/METADATA"
  sed -n '/^\[project.entry-points."sglang.srt.plugins"\]/,/^$/p' pyproject.toml \
    | sed 's/^\[project.entry-points."\(.*\)"\]/[\1]/' | tr -d '"' > "$di/entry_points.txt"
  cp .whl/sglang-bundle.sha256 "$SITE/.route-complete"
  echo "[route] installed in $((SECONDS - t0)) s: $(du -sh "$SITE" | cut -f1)"
}

step_check() {
  "$PY" - <<'EOF' || return 1
import importlib.metadata as md, time, torch
t0 = time.time()
import sglang.srt.server_args, sgl_kernel, flashinfer, xgrammar, transformers  # noqa: F401
from sglang.srt.entrypoints import http_server  # noqa: F401
print(f"[route] imports ok in {time.time() - t0:.1f} s")
for name in ("sglang", "sglang-kernel", "flashinfer-python", "xgrammar", "transformers", "tokenizers", "torch",
             "triton", "hydra-core", "omegaconf"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} MISSING")
print(f"  cuda {torch.version.cuda}, {torch.cuda.get_device_name(0)}, sm {torch.cuda.get_device_capability(0)}")
EOF
  ldd --version 2>&1 | head -1
  df -h /dev/shm /tmp | tail -2
  "$PY" -m spec_decode.runner.doctor --static-only engine=sglang hardware=h200x1 model=llama31_8b_shape \
    drafter=llama31_8b_shape_eagle3 tracking=off
}

step_synthetic() {
  bounded 300 "$PY" -m spec_decode build synthetic --model llama31_8b_shape --drafter llama31_8b_shape_eagle3 --device cuda
}

pack() {  # pack NAME: the newest Hydra dir of this call into $OUT/NAME.tgz
  local d
  d=$(ls -td outputs/*/* multirun/*/* 2>/dev/null | head -1)
  [ -n "$d" ] && tar -czf "$OUT/$1.tgz" "$d" && echo "[route] $d -> $1.tgz"
}

# Both run conf/experiment/sglang_h200x1_dummy.yaml (its flags: random weights, SGLang's triton attention
# and torch sampling, no grammar): `job` one point of it (e.g. spec.steps=3), `sweep` all of it.
experiment() {  # experiment NAME LIMIT_S [overrides...]
  local name=$1 limit=$2; shift 2
  bounded "$limit" "$PY" run.py -m experiment=sglang_h200x1_dummy tracking=off "$@"
  local rc=$?
  pack "$name"
  return $rc
}
step_job() { experiment job 420 "$@"; }
step_sweep() { experiment sweep 540 "$@"; }

rc=0
for s in ${STEPS//,/ }; do
  case $s in install|check|synthetic|job|sweep) ;; *) echo "[route] unknown step $s" >&2; exit 2;; esac
  echo "[route] === $s ($(left) s left)"
  if [ "$s" = job ] || [ "$s" = sweep ]; then
    "step_$s" "$@" 2>&1 | tee "$OUT/$s.log"; r=${PIPESTATUS[0]}
  else
    "step_$s" 2>&1 | tee "$OUT/$s.log"; r=${PIPESTATUS[0]}
  fi
  echo "[route] $s exit $r"
  [ "$r" -ne 0 ] && rc=$r
  [ "$s" = install ] && [ "$r" -ne 0 ] && break
done
exit $rc
