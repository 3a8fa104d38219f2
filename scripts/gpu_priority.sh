#!/usr/bin/env bash
# The GPU measurements issues 20 and 21 wait for, most important first, within a time budget: for a short GPU
# session (a lent machine with 15 minutes in all). Each step runs under `timeout` (its own limit, or what is left of
# the budget if that is less); a step with less of the budget left than its minimum (the time it needs to show
# anything) is skipped and listed, and later, shorter steps still run. Logs and summary.md go to the output folder
# as each step ends (Python's output unbuffered, so a step cut off keeps what it printed): put it under $OUT, so a
# session cut off early still returns what ran. summary.md's header (GPU, versions) is read once, before step 1.
#
#   python -m pip install --no-deps --no-build-isolation -e . -q
#   bash scripts/gpu_priority.sh                      # 540 s budget, output in gpu_priority_out
#   bash scripts/gpu_priority.sh --budget 300 --out "$OUT/p" --from 3   # steps 3.. only
#   bash scripts/gpu_priority.sh --only 1,2,3,6,7     # these steps only, in this order
#   bash scripts/gpu_priority.sh --list               # the steps, their limits and commands; runs nothing
#
# Steps (in order; the session of 2026-11-26 (ninth) ran an earlier list in 538 s on an H100, cold caches). A step
# of several commands runs them all and fails when one fails:
#   1 capture-cuda    the capture tests on CUDA (FULL and PIECEWISE graphs, cuBLAS workspaces, split forwards of
#                     qwen3 / qwen3_next, the engine's overlap): the capture path graphkv drives itself
#   2 decode-kernel-cuda  graphkv.hf's decode kernel against flex on CUDA, flex captured under compile=False (the
#                     ninth session's H100 failure)
#   3 serving-fused   benchmarks/gpu_serving.py, graphkv alone, fused, batch 1 and 32: ms per step, set-up and the
#                     bandwidth limit (issue 20's 1.3x / 1.6x)
#   4 small-matmul    the small-matmul kernel's tests on CUDA (and a tiny Qwen3 served through it), then
#                     benchmarks/gpu_linear.py: the 0.94B model's matrices at 1 token (a sweep of tiles and warps)
#                     and at 8 (defaults), against cuBLAS
#   5 profile-b1      kernels, kernel time, wall (with and without the engine's overlap) per decode step, batch 1,
#                     fused (one trace for every step size) vs fused-1tok (a second trace for 1-token steps, as
#                     served until 2026-11-27) vs fused-merged
#                     (q/k/v and gate/up as one matmul each) vs fused-small (merged, and the small-matmul kernel),
#                     16 layers, the kernels by kind and the top kernels
#   6 kernel-sweep    the decode kernel's split counts, warps, stages and tiles beside SDPA (1 and 32 requests x
#                     512 tokens, and the issue's cells: 32 x 4k / 16k, 1 x 16k); every row printed
#   7 demo-hf-fused   qwen3 and qwen3_next with --compile fused: tokens equal model.generate (failed when a request's
#                     do not), mixed steps captured
#   8 profile-b32     the same profile at batch 32 (fused vs fused-merged vs fused-small)
#   9 hf-tests-fused  graphkv.hf's CUDA tests with GRAPHKV_GPU_COMPILE=fused (the GPU default under "fused": what
#                     making it the default needs); each failure on a line
#  10 memory-full-depth  llama-3.1-8b captured at 32 layers holds within the shipped calibration (issue 21)
#  11 bisect-fused    graphkv.hf serving on the 0.9B model's widths (2 layers): the benchmark's flow, compile="fused"
#                     and graphkv after transformers' reduce-overhead generate (the H100's illegal memory access);
#                     failed when a variant fails
#  12 float32-tokens  the 0.94B model in float32 at batch 1 and 8, fused: graphkv's greedy tokens against generate's
#  13 serving-merged  step 3 with merge_projections=True (the batch-1 profile measured it 0.83x the step's wall time,
#                     2026-11-27): whether it becomes the default
#  14 vs-static-b32   batch 32 against transformers' fastest path (generate with a static cache under torch.compile):
#                     issue 20's "3x its tokens/s", never measured (its compile takes minutes)
#  15 serving-layers  trace_layers on CUDA: its capture test (a graph per layer and key), then step 3 with each
#                     decoder layer traced and compiled once for all (torch 2.11 traces every layer of a whole
#                     forward): set-up seconds against step 3's, and what the lost cross-layer fusion costs per step
#                     (batch 32's process finds batch 1's compiles in Inductor's cache: the warm set-up, its hits
#                     printed); then qwen3_next's demo under it (tokens equal model.generate)
# A lent machine's 15 minutes held one run of --only 2,1,3,6,7,12,4,5 on 2026-11-27 (with its start, about 560 s);
# at most 8 files come back from it, so read summary.md from the run's output (cat it last).
# Exit status 1 when a step failed or timed out, 2 for a bad flag or no GPU.
# (For the script's own test: GPU_PRIORITY_ALLOW_CPU=1 runs it without CUDA; GPU_PRIORITY_STEPS, lines of
# "name|limit seconds|minimum seconds|command", replaces the steps.)
set -uo pipefail
export PYTHONUNBUFFERED=1  # a step killed at its limit keeps every line it printed
CALLER="$PWD"
cd "$(dirname "$0")/.."

BUDGET=540
OUT="gpu_priority_out"
FROM=1
FROM_SET=0
ONLY=""
ONLY_SET=0
LIST=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --budget) BUDGET="${2:-}"; shift ;;
    --out) OUT="${2:-}"; shift ;;
    --from) FROM="${2:-}"; FROM_SET=1; shift ;;
    --only) ONLY="${2:-}"; ONLY_SET=1; shift ;;
    --list) LIST=1 ;;
    -h|--help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_priority.sh: unknown argument '$1' (use --budget S, --out DIR, --from N, --only N,M,..., --list or --help)" >&2
       exit 2 ;;
  esac
  shift
done
for pair in "--budget:$BUDGET" "--from:$FROM"; do
  if ! [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_priority.sh: ${pair%%:*} '${pair#*:}' must be a whole number >= 1" >&2
    exit 2
  fi
done

case "$OUT" in /*) ;; *) OUT="$CALLER/$OUT" ;; esac  # relative to where it was called from
Q_OUT=$(printf '%q' "$OUT")
# Commands of one step run one after the other, each whatever the last one's status; the step fails when any fails.
ALL='r=0; run() { "$@" || r=1; }'
# ($LOG, the step's own log, lets a step check what it printed: demo-hf-fused its token matches, bisect-fused its
# variants' verdicts.)
# name|limit seconds|minimum seconds|command
STEPS=(
  "capture-cuda|150|60|$ALL; run python -m pytest -q -p no:cacheprovider -rf --tb=short tests/runtime/capture/test_capture_gpu.py tests/models/test_engine_overlap.py -k 'cuda or capture_gpu'; TORCH_LOGS=recompiles run python -m pytest -q -p no:cacheprovider -rf --tb=short tests/hf/test_hf_piecewise.py -k cuda; exit \$r"
  "decode-kernel-cuda|90|40|python -m pytest -q -p no:cacheprovider -rf --tb=short tests/hf/test_decode_kernel.py -k cuda"
  "serving-fused|170|120|python benchmarks/gpu_serving.py --gpu --batches 1,32 --repeats 1 --contenders graphkv --compile fused --out $Q_OUT/gpu_serving_fused.json"
  "small-matmul|150|60|$ALL; run python -m pytest -q -p no:cacheprovider -rf --tb=short tests/runtime/ops/test_small_matmul.py tests/hf/test_small_matmul_serving.py -k cuda; run python benchmarks/gpu_linear.py --gpu --rows 1 --sweep --matrices qkv o gate_up down head --tile-n 2 4 8 --tile-k 512 1024 --warps 4 8 --stages 3 --repeats 5 --out $Q_OUT/gpu_linear_1.json; run python benchmarks/gpu_linear.py --gpu --rows 8 --repeats 5 --out $Q_OUT/gpu_linear_8.json; exit \$r"
  "profile-b1|240|120|python scripts/decode_profile_gpu.py --batch 1 --modes fused,fused-1tok,fused-merged,fused-small"
  "kernel-sweep|90|45|python benchmarks/decode_kernel_sweep.py --gpu --cells 1x512 32x512 32x4096 32x16384 1x16384 --splits 1 2 4 8 16 33 --warps 4 8 --stages 2 3 --tiles 64 128 --strides nhd --repeats 5 --out $Q_OUT/sweep.json"
  "demo-hf-fused|120|60|$ALL; run python -m graphkv.cli demo --hf qwen3 --compile fused; run python -m graphkv.cli demo --hf qwen3_next --compile fused; [ \$(grep -cE 'for ([0-9]+)/\\1 requests' \"\$LOG\") -eq 2 ] || { echo 'gpu_priority.sh: tokens differ from model.generate' >&2; r=1; }; exit \$r"
  "profile-b32|200|120|python scripts/decode_profile_gpu.py --batch 32 --modes fused,fused-merged,fused-small"
  "hf-tests-fused|300|120|GRAPHKV_GPU_COMPILE=fused python -m pytest -q -p no:cacheprovider -rf --tb=line tests/hf -k cuda"
  "memory-full-depth|300|120|python -m graphkv.cli bench memory --model llama-3.1-8b --full-depth --out $Q_OUT/bench_memory_full_depth"
  "bisect-fused|280|90|python scripts/bisect_serving_gpu.py --layers 2 --batch 1 --new 8 --variants bench,fused,after_static_compile --timeout 90; r=\$?; ! grep -qE 'FAIL|TIMEOUT|no verdict' \"\$LOG\" || { echo 'gpu_priority.sh: a variant failed' >&2; r=1; }; exit \$r"
  "float32-tokens|200|120|python benchmarks/gpu_serving.py --gpu --dtype float32 --batches 1,8 --new-tokens 32 --repeats 1 --contenders graphkv,generate --compile fused --out $Q_OUT/gpu_serving_float32.json"
  "serving-merged|170|120|python benchmarks/gpu_serving.py --gpu --batches 1,32 --repeats 1 --contenders graphkv --compile fused --merge-projections --out $Q_OUT/gpu_serving_merged.json"
  "vs-static-b32|300|200|python benchmarks/gpu_serving.py --gpu --batches 32 --new-tokens 64 --repeats 1 --contenders graphkv,generate_static_compiled --compile fused --out $Q_OUT/gpu_serving_static.json"
  "serving-layers|240|120|$ALL; run python -m pytest -q -p no:cacheprovider -rf --tb=short tests/hf/test_layer_compile.py -k cuda; run python benchmarks/gpu_serving.py --gpu --batches 1,32 --repeats 1 --contenders graphkv --compile fused --trace-layers --out $Q_OUT/gpu_serving_layers.json; run python -m graphkv.cli demo --hf qwen3_next --compile fused --trace-layers; grep -qE 'for ([0-9]+)/\\1 requests' \"\$LOG\" || { echo 'gpu_priority.sh: tokens differ from model.generate' >&2; r=1; }; exit \$r"
)
if [ -n "${GPU_PRIORITY_STEPS:-}" ]; then
  mapfile -t STEPS <<<"$GPU_PRIORITY_STEPS"
fi
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit least cmd <<<"$step"
  if ! [[ "$limit" =~ ^[0-9]+$ && "$least" =~ ^[0-9]+$ ]] || [ -z "$cmd" ]; then
    echo "gpu_priority.sh: step '$name' is not 'name|limit seconds|minimum seconds|command'" >&2
    exit 2
  fi
done
if [ "$ONLY_SET" -eq 1 ]; then  # an empty or malformed list must not fall back to every step
  if ! [[ "$ONLY" =~ ^[1-9][0-9]{0,2}(,[1-9][0-9]{0,2})*$ ]]; then
    echo "gpu_priority.sh: --only '$ONLY' must be step numbers separated by commas, such as 1,2,3,6" >&2
    exit 2
  fi
  if [ "$FROM_SET" -eq 1 ]; then
    echo "gpu_priority.sh: --only and --from both choose the steps; pass one of them" >&2
    exit 2
  fi
  SEEN=","
  for n in ${ONLY//,/ }; do
    if [ "$n" -gt "${#STEPS[@]}" ]; then
      echo "gpu_priority.sh: --only names step $n, past the last step (${#STEPS[@]}); see --list" >&2
      exit 2
    fi
    if [[ "$SEEN" == *",$n,"* ]]; then
      echo "gpu_priority.sh: --only names step $n twice (its log would be overwritten); name each step once" >&2
      exit 2
    fi
    SEEN+="$n,"
  done
fi
if [ "$FROM" -gt "${#STEPS[@]}" ]; then
  echo "gpu_priority.sh: --from $FROM is past the last step (${#STEPS[@]}); see --list" >&2
  exit 2
fi

if [ "$LIST" -eq 1 ]; then
  i=0
  for step in "${STEPS[@]}"; do
    i=$((i + 1))
    IFS='|' read -r name limit least cmd <<<"$step"
    echo "$i $name ${limit}s (at least ${least}s): $cmd"
  done
  exit 0
fi
if [ "${GPU_PRIORITY_ALLOW_CPU:-0}" != 1 ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_priority.sh: torch.cuda.is_available() is False here; these measurements need a CUDA GPU" >&2
  exit 2
fi

mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
START=$(date +%s)
ROWS=()
FAILED=0
# The header, read once (two Python starts, CUDA's among them, took 4 s a summary when read at every step).
HEADER="# graphkv GPU priority run (budget ${BUDGET} s, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
HEADER+=$'\n\n'$(python -c "import torch; print('    ' + (torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU') + ', torch ' + torch.__version__)" 2>/dev/null)
HEADER+=$'\n'$(python -c "
import importlib
def version(name):
    try:
        return importlib.import_module(name).__version__
    except Exception:
        return 'not importable'
print('    Triton ' + version('triton') + ', numpy ' + version('numpy') + ', transformers ' + version('transformers'))" 2>/dev/null)
if ! python -c "import graphkv" 2>/dev/null; then  # a failed install would fail every step, one by one
  HEADER+=$'\n\n'"graphkv does not import here: install it first (python -m pip install --no-deps --no-build-isolation -e .)"
fi
write_summary() {
  {
    printf '%s\n\n' "$HEADER"
    echo "| # | step | result | seconds | last lines |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
  } >"$SUMMARY"
}

ORDER=()
if [ "$ONLY_SET" -eq 1 ]; then
  ORDER=(${ONLY//,/ })
else
  for ((i = FROM; i <= ${#STEPS[@]}; i++)); do ORDER+=("$i"); done
fi
for i in "${ORDER[@]}"; do
  IFS='|' read -r name limit least cmd <<<"${STEPS[$((i - 1))]}"
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt "$least" ]; then  # too little left to show anything; a later, shorter step may still fit
    ROWS+=("| $i | $name | skipped (${left} s of the budget left, ${least} s needed) | 0 | |")
    continue
  fi
  [ "$((left - 5))" -lt "$limit" ] && limit=$((left - 5))  # a killed step may take 5 s more to go
  echo "== $i $name (limit ${limit} s): $cmd"
  begin=$(date +%s)
  LOG="$OUT/$i-$name.log" timeout -k 5 "$limit" bash -c "$cmd" >"$OUT/$i-$name.log" 2>&1
  rc=$?
  took=$(($(date +%s) - begin))
  if [ "$rc" -eq 0 ]; then status="pass"; elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="TIMEOUT"; else status="exit $rc"; fi
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  tail_lines=$(tail -n 4 "$OUT/$i-$name.log" | tr '\r\n' '  ' | sed 's/|/\\|/g' | cut -c1-300)
  ROWS+=("| $i | $name | $status | $took | $tail_lines |")
  echo "   $status in $took s"
  write_summary
done
write_summary
echo "summary: $SUMMARY ($FAILED step(s) failed or timed out)"
[ "$FAILED" -eq 0 ]
