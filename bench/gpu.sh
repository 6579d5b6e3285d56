#!/usr/bin/env bash
# Steady-state GPU throughput in one device call of at most 8 minutes (issue 40): bench/gpu_bench.py measures
# pre-training pairs/s (SimSiam, ResNet20 at 32 px, eager and --compile; then ResNet18 at 224 px and MoCo-v2
# if time allows), federated image-steps/s one client at a time and vectorised, and Table 2's CIFAR-10 FedAvg
# (100 rounds x 5 local epochs) for as many rounds as fit, extrapolated. One JSON line per measurement, each
# with the device's name, into $OUT (default bench/gpu-results/; a dry run's: a temporary folder) as
# <device>-<commit>-<time>.jsonl.
#
#   bash bench/gpu.sh              on the GPU machine: the device tool's run with timeout_s=480 and
#                                  carry=[".whl"] (docs/performance.md, GPU measurements)
#   bash bench/gpu.sh --dry-run    every measurement on the CPU at tiny sizes (~20 s on 2 cores), then checks
#                                  that the file holds every measurement, each ok (CI: tests/test_gpu_bench.py)
#   bash bench/gpu.sh --checks     the GPU checks of issue 26 instead: pytest -m gpu, torchrun + NCCL, Flower
#
# WHEELS (default .whl): a folder of wheels installed with pip --no-index --no-deps into /tmp/site when it
# exists and this is not a dry run. BUDGET: seconds after which no measurement starts (default 440). SKIP:
# comma-separated measurement names to leave out (those an earlier call measured).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
dry=0
for arg in "$@"; do
    case $arg in
        --dry-run) dry=1; args+=(--dry-run) ;;
        --checks) args+=(--checks) ;;
        *) echo "gpu.sh: unknown argument $arg (--dry-run, --checks)" >&2; exit 2 ;;
    esac
done
default_out=bench/gpu-results
[[ $dry -eq 1 ]] && default_out=$(mktemp -d)  # a dry run leaves nothing in the tree
out=${OUT:-$default_out}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project from this tree, without pip install -e
wheels=${WHEELS:-.whl}
if [[ $dry -eq 0 && -d "$wheels" ]] && compgen -G "$wheels/*.whl" > /dev/null; then
    echo "[gpu.sh] installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$wheels"/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONUNBUFFERED=1
log=$(mktemp)
"$py" bench/gpu_bench.py "${args[@]}" --out "$out" ${BUDGET:+--budget "$BUDGET"} ${SKIP:+--skip "$SKIP"} | tee "$log"
file=$(sed -n 's/^\[gpu.sh\] wrote //p' "$log" | tail -1)
rm -f "$log"
[[ -n "$file" ]] || { echo "gpu.sh: no results file was written" >&2; exit 1; }
if [[ $dry -eq 1 ]]; then  # the dry run must produce every measurement, each ok
    if [[ " ${args[*]} " == *" --checks "* ]]; then
        ! grep -q '"status": "failed"' "$file" || { echo "gpu.sh: a check failed, see $file" >&2; exit 1; }
    else
        "$py" bench/gpu_bench.py --dry-run --check "$file"
    fi
fi
