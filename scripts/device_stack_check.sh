#!/usr/bin/env bash
# The test suite on the GPU machine's software stack, on any machine (on a CPU the CUDA tests skip; the rest shows what
# breaks on those older versions): torch 2.11, Triton 3.6 and transformers 5.17 are what the lent H100 runs
# (../shared/gpu/README.md), older than what CI installs, and a GPU session is too short to find version breakage
# there. Builds a virtual environment with those versions (about 3 GB
# of downloads the first time: torch's CUDA wheel and its NVIDIA libraries; kept and reused), installs this checkout
# into it, and runs the suite in two workers. Its first run (2026-11-27) found four things the H100 would have hit
# or shown wrong: compiled CPU flex aborting the process, Gemma-2's soft-cap dropped by transformers' sdpa reference,
# the serving benchmark's contenders after a failed one, and Triton 3.6's interpreter under numpy 2.4.
#
#   bash scripts/device_stack_check.sh                        # venv beside the checkout, the whole suite
#   bash scripts/device_stack_check.sh --venv /tmp/v -- tests/hf -x   # pytest arguments after --
#   bash scripts/device_stack_check.sh --print                # the versions and commands; runs nothing
#
# numpy is held below 2.4: Triton 3.6's interpreter (the CPU run of graphkv's kernels) fails under numpy 2.4
# (graphkv names that with the fix: graphkv.kernels.launch). The venv's bin/ comes first on PATH while the suite runs,
# so the scripts and CLIs the tests start run on the same stack. Exit status: pytest's, or 2 for a bad flag.
set -uo pipefail
CALLER="$PWD"
cd "$(dirname "$0")/.."

TORCH="torch==2.11.0"
TRITON="triton==3.6.0"
TRANSFORMERS="transformers==5.17.0"
NUMPY="numpy<2.4"
VENV="$(dirname "$PWD")/device-stack-venv"  # beside the checkout
PRINT=0
PYTEST_ARGS=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --venv) VENV="${2:-}"; shift
            [ -n "$VENV" ] || { echo "device_stack_check.sh: --venv needs a folder" >&2; exit 2; } ;;
    --print) PRINT=1 ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "device_stack_check.sh: unknown argument '$1' (use --venv DIR, --print, -- PYTEST_ARGS or --help)" >&2
       exit 2 ;;
  esac
  shift
done
[ "${#PYTEST_ARGS[@]}" -eq 0 ] && PYTEST_ARGS=(-q -n 2 -p no:cacheprovider)
case "$VENV" in /*) ;; *) VENV="$CALLER/$VENV" ;; esac  # relative to where it was called from; absolute on PATH

COMMANDS=(
  "python3 -m venv $(printf '%q' "$VENV")"
  "$(printf '%q' "$VENV")/bin/python -m pip install -q '$TORCH' '$TRITON' '$TRANSFORMERS' '$NUMPY'"
  "$(printf '%q' "$VENV")/bin/python -m pip install -q -e '.[dev]' '$TORCH' '$TRITON' '$TRANSFORMERS' '$NUMPY'"
  "PATH=$(printf '%q' "$VENV")/bin:\$PATH TORCHINDUCTOR_CACHE_DIR=$(printf '%q' "$VENV")/inductor python -m pytest$(
    printf ' %q' "${PYTEST_ARGS[@]}")"
)
if [ "$PRINT" -eq 1 ]; then
  echo "stack: $TORCH $TRITON $TRANSFORMERS $NUMPY"
  printf '%s\n' "${COMMANDS[@]}"
  exit 0
fi
[ -x "$VENV/bin/python" ] || bash -c "${COMMANDS[0]}" || exit $?
for cmd in "${COMMANDS[@]:1:2}"; do
  echo "== $cmd"
  bash -c "$cmd" || exit $?
done
"$VENV/bin/python" -c "import torch, triton, transformers, numpy; print('stack: torch', torch.__version__, 'triton', \
triton.__version__, 'transformers', transformers.__version__, 'numpy', numpy.__version__)"
echo "== ${COMMANDS[3]}"
bash -c "${COMMANDS[3]}"
