#!/usr/bin/env bash
# Pre-training throughput (README, Performance): one JSON line per setting, from `pretrain --profile`.
# CPU: the figure (ResNet20, 32 px, 2,048 pairs, batch 128; the whole command must take < 60 s).
# GPU (when one is visible): ResNet20, 32 px, batch 256, bf16 autocast, channels-last, augmentations on the GPU.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s.%N)
pretrain fps --arch resnet20 --size 32 --epochs 1 --pairs-per-epoch 2048 --batch-size 128 --device cpu \
    --out "$tmp/cpu.ckpt" --profile --quiet | head -n 1
python -c "import json, sys; print(json.dumps({'cpu_command_wall_s': round(float(sys.argv[2]) - float(sys.argv[1]), 1)}))" \
    "$start" "$(date +%s.%N)"
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    pretrain fps --arch resnet20 --size 32 --epochs 1 --pairs-per-epoch 300000 --batch-size 256 --device cuda \
        --amp --out "$tmp/gpu.ckpt" --profile --quiet | head -n 1
fi
