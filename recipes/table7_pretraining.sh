#!/usr/bin/env bash
# Table 7: which synthetic pre-training: fractal multi-label (supervised), single fractals + SimSiam,
# FPS + SimSiam, FPS + MoCo-v2, each then FedAvg on CIFAR-10 (10 clients, Dir(0.3)).
# GPU time (estimate, not measured): four 100-epoch pre-trainings (about 2 h each at the target rate)
# plus 4 x 3 CIFAR-10 federated runs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet20 32)
common=(--arch resnet20 --size 32 --epochs 100 --pairs-per-epoch 1000000 --batch-size 256 --amp --device "$DEVICE")
[ -f "$OUT/multilabel.ckpt" ] || pretrain multilabel "${common[@]}" --out "$OUT/multilabel.ckpt"
[ -f "$OUT/single.ckpt" ] || pretrain fractal-simsiam "${common[@]}" --out "$OUT/single.ckpt"
[ -f "$OUT/fps-moco.ckpt" ] || pretrain fps --method mocov2 "${common[@]}" --out "$OUT/fps-moco.ckpt"
for seed in $SEEDS; do
  for init in "$OUT/multilabel.ckpt" "$OUT/single.ckpt" "$fps" "$OUT/fps-moco.ckpt"; do
    federate --dataset cifar10 --data-root "$DATA" --download --init "$init" --seed $seed \
             --device "$DEVICE" --out "$OUT/t7-$(basename "$init" .ckpt)-s$seed"
  done
done
analyze report "$OUT"/t7-* --out "$OUT/table7"
