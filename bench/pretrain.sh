#!/usr/bin/env bash
# Pre-training throughput (docs/performance.md): one JSON line per setting, from `pretrain --profile`.
# CPU: the figure (ResNet20, 32 px, 2,048 pairs, batch 128; the whole command must take < 60 s).
# GPU (when one is visible): ResNet20, 32 px, batch 256, bf16 autocast, channels-last, augmentations on the GPU.
# DDP (torchrun, "processes" in each line): on CPU, 1 gloo process with every core's thread against 2 with
# half each, the same global batch; with 2+ GPUs, one NCCL process per GPU. Pairs/s count the global batch.
# Knobs: PAIRS (CPU settings, default 2048), GPU_PAIRS (default 300000). Measure on an idle machine.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pairs=${PAIRS:-2048}
gpu_pairs=${GPU_PAIRS:-300000}
cpu=(fps --arch resnet20 --size 32 --epochs 1 --pairs-per-epoch "$pairs" --batch-size 128 --device cpu --profile
     --quiet)
gpu=(fps --arch resnet20 --size 32 --epochs 1 --pairs-per-epoch "$gpu_pairs" --batch-size 256 --device cuda --amp
     --profile --quiet)
first_line() { out=$("$@"); echo "${out%%$'\n'*}"; }  # no `| head`: a closed pipe would kill a rank
torchrun_n() { local n=$1; shift; torchrun --standalone --nproc-per-node "$n" --no-python pretrain "$@"; }

start=$(date +%s.%N)
first_line pretrain "${cpu[@]}" --out "$tmp/cpu.ckpt"
python -c "import json, sys; print(json.dumps({'cpu_command_wall_s': round(float(sys.argv[2]) - float(sys.argv[1]), 1)}))" \
    "$start" "$(date +%s.%N)"
cores=$(python -c "import os; print(len(os.sched_getaffinity(0)))")  # not nproc: it obeys OMP_NUM_THREADS
for procs in 1 2; do
    OMP_NUM_THREADS=$(( cores / procs > 0 ? cores / procs : 1 )) \
        first_line torchrun_n "$procs" "${cpu[@]}" --workers 0 --out "$tmp/ddp$procs.ckpt"
done
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -ge 1 ]; then
    first_line pretrain "${gpu[@]}" --out "$tmp/gpu.ckpt"
fi
if [ "$gpus" -ge 2 ]; then
    first_line torchrun_n "$gpus" "${gpu[@]}" --out "$tmp/gpu$gpus.ckpt"
fi
