#!/usr/bin/env bash
# The GPU session kit: everything issue 15 measures on the lent 2 x H200 machine, in one or two device
# calls of <= 9 minutes. Run from the repository root, the wheels in .whl/ (carry: [".whl"]):
#
#   bash benchmarks/gpu/session.sh STEPS [sweep overrides...]
#     STEPS: comma-separated, run in the order given (all = tests,probe,engine,sweep); a step named
#            twice runs twice (tests,tests: two consecutive runs; the second log is tests-2.log)
#       profile benchmarks/gpu/engine_profile.py on one GPU (per-graph GPU/host us, kernel counts,
#               generate us/token; PROFILE_ARGS, e.g. "--variants ops --compile"); profile.json
#       tests   python -m pytest -m gpu (one process: -p no:xdist, the ini addopts off) tests/gpu tests/integration/test_nccl_probe.py
#               (GPU_TESTS, e.g. "tests/gpu/test_slot_attention.py", runs those instead)
#       probe   NCCL probe, world size 2, nccl=default,tuned,no_p2p, two interleaved repetitions;
#               NCCL_DEBUG capture per profile (the golden files tests/data/logs/nccl_debug_<p>.log)
#       engine  benchmarks/embedded_engine.py --device cuda (graph and eager, interleaved) on one GPU
#               [ENGINE_ARGS, e.g. "--rounds 5"; ENGINE_GPUS (default 0), e.g. 0,1 for --tp-size 2;
#               ENGINE_EAGER_RERUN=0 skips the eager-only rerun]
#       batching  the embedded engine batched on its CUDA graphs (issues 26, 28), one GPU: the GPU tests
#               of batching (16 concurrent == alone, graph buckets in /server_info, eager above the cap;
#               the bs-1 graph path == eager, steps 0 and 3), then benchmarks/embedded_batching.py at
#               concurrency 1,2,4,8,16,32 (graphs, baseline vs steps 3; BATCHING_ARGS adds flags, e.g.
#               "--paths static,eager"; issue 41's overlap table: "--steps 1,3,5 --concurrency 1,8 --overlap-off-at 1,8";
#               BATCHING_TESTS=0 skips the tests, BATCHING_TIMEOUT_S (default 150) bounds the benchmark); batching.json
#       realshape  benchmarks/gpu/real_shape.py on one GPU (issue 31: the 8B-shaped synthetic pair, cycle
#               against the roofline; REAL_SHAPE_ARGS, e.g. "--steps 1,3 --attention sdpa,bmm --kernels");
#               real_shape.tgz (REAL_SHAPE_TIMEOUT_S, default 360); realshape,realshape runs it twice,
#               the second with REAL_SHAPE_ARGS_2 if set, into real_shape-2.tgz
#       putsync  benchmarks/gpu/put_sync.py on one GPU: StaticRunner._put from pageable vs pinned memory (the
#               copy's wait for the GPU, the 8B steps-1 cycle); PUT_SYNC_ARGS, e.g. "--repeats 3"
#       noise   benchmarks/gpu/launch_noise.py on one GPU: launch-to-launch tok/s of a baseline and a steps-3
#               rank group, their ranks free or pinned to fixed cores, interleaved (NOISE_ARGS); noise.json
#       draftchain  benchmarks/gpu/draft_chain.py on one GPU: a cycle's host operations now vs stepwise draft vs
#               the old host glue, interleaved in one process (DRAFT_CHAIN_ARGS, e.g. "--steps 3,5 --rounds 7"); draft_chain.json
#       sweep   python run.py -m experiment=$SESSION_EXPERIMENT tracking=off [overrides]
#               (SESSION_EXPERIMENT may map GPU names to experiments: "H200=a,H100=b", see pick_experiment)
#               (default embedded_h200x2_steps_nccl; on one GPU add hardware=h200x1; SWEEP_TIMEOUT_S bounds it)
#   e.g.  bash benchmarks/gpu/session.sh tests,probe,engine     # call 1
#         PROBE_BACKEND=gloo bash benchmarks/gpu/session.sh probe   # a CPU check of the kit
#         bash benchmarks/gpu/session.sh sweep                  # call 2
#         bash benchmarks/gpu/session.sh sweep nccl=no_p2p      # a part of the sweep
#
# Writes into $OUT (default ./gpu_out): <step>.log for each step, probe.tgz (JSON + debug logs +
# machine facts + tables.md) and sweep.tgz (the multirun dir: results.json, server.log, profile.jsonl
# per job; extract at the repo root, then python -m spec_decode.views.tracking sync multirun/<dir>).
# The device tool brings back at most 8 files: at the end, when $OUT holds more (several steps, a
# second sweep, extra files a command wrote there), the logs are folded into logs.tgz and, if still
# too many, everything but the archives into rest.tgz (the output tail keeps the last 12,000 characters
# anyway). CLOCKS=1 samples the GPU's clocks, power and load every 200 ms (nvidia-smi) for the whole
# call into clocks.csv.gz; PLACEMENT=1 writes, every second, the CPU each busy thread (> 5% CPU) ran on,
# with the SMT sibling lists, into placement.txt.gz. Every step runs under `timeout`, and the whole call under SESSION_BUDGET_S
# (default 540 s), so the files come back even when a step hangs.
set -u -o pipefail

STEPS=${1:-all}
shift || true
[ "$STEPS" = all ] && STEPS=tests,probe,engine,sweep
OUT=${OUT:-$PWD/gpu_out}
WORK=${SESSION_WORK:-/tmp/spec_decode_session}
SITE=${SESSION_SITE:-/tmp/site}
PY=${PYTHON:-python3}
BUDGET_S=${SESSION_BUDGET_S:-540}
mkdir -p "$OUT" "$WORK"
for s in ${STEPS//,/ }; do
  case $s in profile|tests|probe|engine|batching|realshape|putsync|noise|draftchain|sweep) ;; *) echo "session.sh: unknown step '$s' (profile, tests, probe, engine, batching, realshape, putsync, noise, draftchain, sweep, all)" >&2; exit 2;; esac
done

# The lent machine's rule (KINDS.md): NVLink multicast stays off in every NCCL process. The runner
# drops inherited NCCL_* from its servers, so the rule also goes into /etc/nccl.conf, which NCCL reads
# in every process (a variable that is set wins over the file; no profile sets this one).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Only on a GPU machine (nvidia-smi there): a CPU check of the kit leaves /etc alone.
if command -v nvidia-smi >/dev/null && [ -w /etc ] && ! grep -qs '^NCCL_NVLS_ENABLE=0' /etc/nccl.conf; then
  echo NCCL_NVLS_ENABLE=0 >> /etc/nccl.conf
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true

left() { echo $((BUDGET_S - SECONDS)); }
# bounded STEP_TIMEOUT_S CMD...: the step's own limit, or what is left of the budget (minus 20 s for tar)
bounded() {
  local t=$1; shift
  local rest=$(( $(left) - 20 ))
  [ "$rest" -lt "$t" ] && t=$rest
  if [ "$t" -le 5 ]; then echo "[session] no time left for: $*"; return 124; fi
  # SIGINT first: the runner and pytest then stop their servers (own sessions) before exiting.
  timeout -s INT -k 20 "$t" "$@"
}

install() {
  echo "[session] install: wheels + this package into $SITE"
  # The runner's wheels: .whl/*.whl, or .whl/runner/*.whl (carry: [".whl/runner"], without the SGLang bundle)
  local wheels=()
  for w in .whl/*.whl .whl/runner/*.whl; do [ -e "$w" ] && wheels+=("$w"); done
  if [ "${#wheels[@]}" -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" || return 1
  fi
  # Our package, so that its entry point (sglang.srt.plugins -> spec_decode_profiler) is visible.
  # Built from a copy: the repository tree stays as it came (no build/ or egg-info in it).
  rm -rf "$WORK/src" && mkdir -p "$WORK/src" && cp -r pyproject.toml README.md spec_decode "$WORK/src/" || return 1
  if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WORK/src"; then
    # No usable setuptools there: the entry point needs only a dist-info folder on the path (the
    # code itself is imported from the repository, which goes on PYTHONPATH below).
    echo "[session] pip could not build this package: writing its dist-info by hand"
    local di="$SITE/spec_decode_bench-0.0.0.dist-info"
    mkdir -p "$di" && printf 'Metadata-Version: 2.1\nName: spec-decode-bench\nVersion: 0.0.0\n' > "$di/METADATA"
    sed -n '/^\[project.entry-points."sglang.srt.plugins"\]/,/^$/p' pyproject.toml \
      | sed 's/^\[project.entry-points."\(.*\)"\]/[\1]/' | tr -d '"' > "$di/entry_points.txt"
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" - <<'EOF' || return 1
from importlib.metadata import entry_points
import hydra, omegaconf, torch
eps = sorted(e.value for e in entry_points(group="sglang.srt.plugins"))
assert "spec_decode.profiler.plugin:register" in eps, f"plugin entry point not visible: {eps}"
print(f"[session] python ok: torch {torch.__version__} (cuda {torch.version.cuda}, nccl "
      f"{'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}), "
      f"{torch.cuda.device_count()} GPU(s) {sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})}, hydra {hydra.__version__}, omegaconf {omegaconf.__version__}, plugins {eps}")
EOF
}

machine() {
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -r), $(nproc) cores"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  echo "topology:"; nvidia-smi topo -m 2>&1
  echo "NCCL_* here: $(env | grep '^NCCL_' | sort | tr '\n' ' ')"
  echo "/etc/nccl.conf: $(tr '\n' ' ' < /etc/nccl.conf 2>/dev/null)"
}

# A server that outlived its runner or test (servers get their own session, so the timeout's group
# kill misses them) would hold the GPUs for the next step. Only processes that carry this call's
# token in their environment are ended (never others' by name), each by pid.
export SPEC_DECODE_SESSION_TOKEN="session-$$-$RANDOM$RANDOM"
reap() {
  local f pid
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}; pid=${pid%/environ}
    [ "$pid" = $$ ] && continue
    { tr '\0' '\n' < "$f"; } 2>/dev/null | grep -qx "SPEC_DECODE_SESSION_TOKEN=$SPEC_DECODE_SESSION_TOKEN" || continue
    { tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | grep -q "spec_decode.engines.embedded" || continue
    echo "[session] leftover server process $pid of this call: killing"; kill -9 "$pid" 2>/dev/null
  done
}

step_profile() {
  # shellcheck disable=SC2086  # PROFILE_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=0 bounded 300 "$PY" benchmarks/gpu/engine_profile.py --json "$OUT/profile.json" ${PROFILE_ARGS:-}
}

step_tests() {
  # shellcheck disable=SC2086  # GPU_TESTS is a list of paths / node ids
  bounded 300 "$PY" -m pytest -q -s -p no:cacheprovider -p no:xdist -o addopts='--strict-markers -ra' -m gpu \
    ${GPU_TESTS:-tests/gpu tests/integration/test_nccl_probe.py}
  local rc=$?
  reap
  return $rc
}

step_probe() {
  local d="$WORK/probe" rc=0 p rep
  rm -rf "$d" && mkdir -p "$d"
  machine | tee "$d/machine.txt"
  # Decode sizes: 4 KiB..1 MiB, Kimi-K2.5's 14336 (7168 x bf16) and the tiny target's (--model-path).
  for rep in 1 2; do
    for p in default tuned no_p2p; do
      echo "[session] probe nccl=$p repetition $rep"
      local dbg=(--no-debug)
      [ "$rep" = 1 ] && dbg=(--debug-log "$d/nccl_debug_$p.log")
      bounded 150 "$PY" -m spec_decode.probe.nccl --world-size 2 --backend "${PROBE_BACKEND:-nccl}" --nccl "$p" \
        --sizes 4096,14336,16384,65536,262144,1048576 --model-path models/tiny/target \
        --iters 200 --rounds 10 --timeout-s 60 "${dbg[@]}" --json "$d/nccl_probe_${p}_r$rep.json" || rc=$?
    done
  done
  "$PY" benchmarks/gpu/probe_table.py "$d"/nccl_probe_*.json | tee "$d/tables.md"
  tar -czf "$OUT/probe.tgz" -C "$WORK" probe
  return $rc
}

step_engine() {
  local help
  help=$("$PY" benchmarks/embedded_engine.py --help 2>&1) || { echo "[session] benchmarks/embedded_engine.py --help failed: $help"; return 1; }
  if ! grep -q -- "--device" <<<"$help"; then echo "[session] embedded_engine.py has no --device: skipped"; return 0; fi
  echo "[session] embedded engine, one GPU, default (CUDA graphs when the engine has them)"
  # shellcheck disable=SC2086  # ENGINE_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=${ENGINE_GPUS:-0} bounded 240 "$PY" benchmarks/embedded_engine.py --device cuda --json "$OUT/engine.json" ${ENGINE_ARGS:-}
  local rc=$?
  if [ "${ENGINE_EAGER_RERUN:-1}" = 0 ]; then
    :
  elif grep -q -- "--disable-cuda-graph" <<<"$help"; then
    echo "[session] embedded engine, one GPU, --disable-cuda-graph (eager)"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=${ENGINE_GPUS:-0} bounded 240 "$PY" benchmarks/embedded_engine.py --device cuda --disable-cuda-graph ${ENGINE_ARGS:-} || rc=$?
  else
    echo "[session] embedded_engine.py has no --disable-cuda-graph yet: eager-only engine measured above"
  fi
  return $rc
}

step_batching() {
  local rc=0
  [ "${BATCHING_TESTS:-1}" = 0 ] || CUDA_VISIBLE_DEVICES=0 bounded 200 "$PY" -m pytest -q -p no:cacheprovider -p no:xdist -o addopts='--strict-markers -ra' -m gpu tests/gpu/test_engine_concurrency.py \
    "tests/gpu/test_engine_graphs.py::test_16_concurrent_requests_on_cuda_with_graphs_give_the_batch_size_1_outputs" \
    "tests/gpu/test_engine_graphs.py::test_graphs_equal_eager_at_tp1[0]" \
    "tests/gpu/test_engine_graphs.py::test_graphs_equal_eager_at_tp1[3]" || rc=$?
  reap
  # shellcheck disable=SC2086  # BATCHING_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=0 bounded "${BATCHING_TIMEOUT_S:-150}" "$PY" benchmarks/embedded_batching.py --device cuda --concurrency 1,2,4,8,16,32 \
    --rounds 3 --tokens 64 --budget-s 60 --json "$OUT/batching.json" ${BATCHING_ARGS:-} || rc=$?
  return $rc
}

step_realshape() {
  # The n-th realshape step of a call takes REAL_SHAPE_ARGS_n if set (else REAL_SHAPE_ARGS) and writes
  # real_shape-n.tgz (the first: real_shape.tgz), e.g. the GEMM micro-benchmark, then the cycles. (A step
  # runs in a pipeline's subshell: n is counted from the archives already written.)
  local rc args n=1 suffix=""
  while [ -e "$OUT/real_shape$suffix.tgz" ]; do n=$((n + 1)); suffix="-$n"; done
  args="REAL_SHAPE_ARGS_$n"
  args=${!args-${REAL_SHAPE_ARGS:-}}
  rm -rf "$WORK/real_shape"
  echo "[session] real_shape.py $args"
  # shellcheck disable=SC2086  # args is a list of flags
  # The repository first on the path: real_shape reads conf/ next to the spec_decode it imports.
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$PWD:$PYTHONPATH" bounded "${REAL_SHAPE_TIMEOUT_S:-360}" "$PY" benchmarks/gpu/real_shape.py --out "$WORK/real_shape" $args
  rc=$?
  [ -d "$WORK/real_shape" ] && tar -czf "$OUT/real_shape$suffix.tgz" -C "$WORK" real_shape
  return $rc
}

step_putsync() {
  # The graphs' host values from pageable vs pinned memory (StaticRunner.pin_puts): the copy behind a queued
  # GPU sleep, and the 8B steps-1 cycle interleaved. Prints only (the log comes back).
  # shellcheck disable=SC2086  # PUT_SYNC_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$PWD:$PYTHONPATH" bounded "${PUT_SYNC_TIMEOUT_S:-200}" "$PY" benchmarks/gpu/put_sync.py ${PUT_SYNC_ARGS:-}
}

step_noise() {
  # Launch-to-launch noise with the ranks free or pinned (benchmarks/gpu/launch_noise.py); NOISE_ARGS, e.g.
  # "--launches 4 --pin 2,3"; NOISE_TIMEOUT_S (default 200) bounds it; noise.json
  # shellcheck disable=SC2086  # NOISE_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$PWD:$PYTHONPATH" bounded "${NOISE_TIMEOUT_S:-200}" "$PY" benchmarks/gpu/launch_noise.py --json "$OUT/noise.json" ${NOISE_ARGS:-}
}

step_draftchain() {
  # The draft chain in one graph against one replay per step (benchmarks/gpu/draft_chain.py); DRAFT_CHAIN_ARGS,
  # DRAFT_CHAIN_TIMEOUT_S (default 200); draft_chain.json
  # shellcheck disable=SC2086  # DRAFT_CHAIN_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$PWD:$PYTHONPATH" bounded "${DRAFT_CHAIN_TIMEOUT_S:-200}" "$PY" benchmarks/gpu/draft_chain.py --json "$OUT/draft_chain.json" ${DRAFT_CHAIN_ARGS:-}
}

# pick_experiment: SESSION_EXPERIMENT is one experiment, or GPU-name=experiment pairs, e.g.
# "H200=embedded_h200x1_steps_nccl,H100=embedded_h100x1_steps_nccl": the first pair whose name occurs in
# what nvidia-smi reports for GPU 0 (a call that names no kind may get either card; the preflight refuses a
# sweep whose hardware label is not the card's, so the choice has to be made here).
pick_experiment() {
  local spec=${SESSION_EXPERIMENT:-embedded_h200x2_steps_nccl} gpu pair
  case $spec in *=*) ;; *) echo "$spec"; return 0;; esac
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  for pair in ${spec//,/ }; do
    case $gpu in *"${pair%%=*}"*) echo "${pair#*=}"; return 0;; esac
  done
  echo "[session] SESSION_EXPERIMENT=$spec: no experiment for this GPU ('${gpu:-no nvidia-smi}')" >&2
  return 1
}

step_sweep() {
  local dir rc exp
  exp=$(pick_experiment) || return 2
  dir="multirun/$(date -u +%Y-%m-%d)/$(date -u +%H-%M-%S)_$exp"
  echo "[session] sweep into $dir; overrides: $*"
  bounded "${SWEEP_TIMEOUT_S:-9999}" "$PY" run.py -m "experiment=$exp" tracking=off "hydra.sweep.dir=$dir" "$@"
  rc=$?
  reap
  [ -d "$dir" ] && tar -czf "$OUT/sweep.tgz" "$dir"
  return $rc
}

# fold_out: at most OUT_MAX_FILES (8) plain files directly under $OUT (the device tool's limit).
fold_out() {
  local max=${OUT_MAX_FILES:-8} f
  local files=()
  count() { files=(); for f in "$OUT"/*; do [ -f "$f" ] && files+=("${f##*/}"); done; }
  count
  [ "${#files[@]}" -le "$max" ] && return 0
  local logs=()
  for f in "${files[@]}"; do case $f in *.log) logs+=("$f");; esac; done
  if [ "${#logs[@]}" -gt 1 ]; then
    tar -czf "$OUT/logs.tgz" -C "$OUT" "${logs[@]}" && (cd "$OUT" && rm -f "${logs[@]}")
    echo "[session] more than $max files under \$OUT: ${logs[*]} folded into logs.tgz"
  fi
  count
  [ "${#files[@]}" -le "$max" ] && return 0
  local rest=()
  for f in "${files[@]}"; do case $f in *.tgz) ;; *) rest+=("$f");; esac; done
  tar -czf "$OUT/rest.tgz" -C "$OUT" "${rest[@]}" && (cd "$OUT" && rm -f "${rest[@]}")
  echo "[session] still more than $max files: ${rest[*]} folded into rest.tgz"
  count
  [ "${#files[@]}" -le "$max" ] || echo "[session] warning: ${#files[@]} files under \$OUT; the device tool returns $max"
}

clock_pid=""
if [ "${CLOCKS:-0}" = 1 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 200 > "$WORK/clocks.csv" 2>&1 &
  clock_pid=$!
fi

place_pid=""
if [ "${PLACEMENT:-0}" = 1 ]; then  # which CPU each busy thread ran on, every second (ps), and the SMT siblings
  { grep -H . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null; lscpu 2>/dev/null; } > "$WORK/placement.txt"
  while sleep 1; do echo "t $(date +%s.%N)"; ps -eLo pid,tid,psr,pcpu,args --no-headers | awk '$4 > 5' | cut -c1-160; done >> "$WORK/placement.txt" 2>&1 &
  place_pid=$!
fi

install 2>&1 | tee "$OUT/install.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "[session] install failed: see install.log"; exit 1; }
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
for s in ${STEPS//,/ }; do
  echo "[session] === $s (t=${SECONDS}s, budget left $(left)s)"
  log="$OUT/$s.log" n=2
  while [ -e "$log" ]; do log="$OUT/$s-$n.log"; n=$((n + 1)); done
  if [ "$s" = sweep ]; then step_sweep "$@" 2>&1 | tee "$log"; else "step_$s" 2>&1 | tee "$log"; fi
  rc=${PIPESTATUS[0]}
  echo "[session] === $s exit $rc after ${SECONDS}s"
  [ "$rc" = 0 ] || status=1
done
if [ -n "$clock_pid" ]; then kill "$clock_pid" 2>/dev/null; gzip -c "$WORK/clocks.csv" > "$OUT/clocks.csv.gz"; fi
if [ -n "$place_pid" ]; then kill "$place_pid" 2>/dev/null; gzip -c "$WORK/placement.txt" > "$OUT/placement.txt.gz"; fi
fold_out
ls -la "$OUT"
exit $status
