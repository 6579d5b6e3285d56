#!/usr/bin/env bash
# The whole GPU verification in one call (issue 26), under 10 minutes on one H100: installs what the GPU
# image lacks from carried wheels, then bench/gpu_bench.py runs `pytest -m gpu`, pre-training pairs/s (32 and
# 224 px, with and without --amp, 0/4/8 workers, renderer feed against model consumption), federate seconds
# a round (CIFAR-10-shaped, --client-batch 1 and auto, FedAvg and SCAFFOLD), a 1-process torchrun
# pre-training with an NCCL all-reduce, and Flower with num_gpus resources; one JSON file, gpu.json, in $OUT.
#
#   bash bench/gpu.sh              on the GPU machine (docs/performance.md, GPU verification: how to call it with the wheels)
#   bash bench/gpu.sh --dry-run    the same steps on the CPU at tiny sizes (gloo; no install), for CI
#
# WHEELS (default .whl): a folder of wheels installed with pip --no-index --no-deps into /tmp/site when it
# exists and this is not a dry run. OUT (default: a fresh temporary folder) receives gpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=()
[[ "${1:-}" == "--dry-run" ]] && dry=(--dry-run)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project from this tree, without pip install -e
wheels=${WHEELS:-.whl}
if [[ ${#dry[@]} -eq 0 && -d "$wheels" ]] && compgen -G "$wheels/*.whl" > /dev/null; then
    echo "[gpu.sh] installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$wheels"/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONUNBUFFERED=1
"$py" bench/gpu_bench.py "${dry[@]}" --out "$out/gpu.json" ${ONLY:+--only "$ONLY"}
