#!/usr/bin/env bash
# Table 6: a domain far from natural images (§4.5): chest X-rays as an image folder
# (ROOT/train/<class>/, ROOT/test/<class>/), ResNet18 at 224 px; random, FPS and ImageNet init.
# GPU time (estimate, not measured): depends on the folder size; six runs of 100 rounds x 5 local epochs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet18 224)
for seed in $SEEDS; do
  for init in random "$fps" imagenet; do
    name=$(basename "$init" .ckpt)
    federate --dataset imagefolder --data-root "$DATA/chest_xray" --arch resnet18 --init "$init" \
             --seed $seed --device "$DEVICE" --out "$OUT/t6-$name-s$seed"
    federate --dataset imagefolder --data-root "$DATA/chest_xray" --arch resnet18 --init "$init" \
             --seed $seed --device "$DEVICE" --centralized --out "$OUT/t6-$name-cl-s$seed"
  done
done
analyze report "$OUT"/t6-* --out "$OUT/table6"
