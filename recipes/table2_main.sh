#!/usr/bin/env bash
# Table 2: Federated, Centralised and ΔCL-FL for random, FPS and ImageNet init on CIFAR-10, CIFAR-100,
# Tiny-ImageNet (ResNet20 at 32 px; ResNet18 at 224 px for Tiny-ImageNet) and iNat-GEO (ResNet18):
# 10 clients, Dir(0.3), 100 rounds x 5 local epochs, full participation (§4.2).
# GPU time (estimate, not measured): one CIFAR federated run is 100 x 5 = 500 epochs over 50,000 images
# (ResNet20); the table is 4 datasets x 3 inits x 2 (FL, CL) x 3 seeds = 72 runs.
source "$(dirname "$0")/common.sh"
fps32=$(fps_ckpt resnet20 32)
fps224=$(fps_ckpt resnet18 224)
for seed in $SEEDS; do
  for ds in cifar10 cifar100; do
    for init in random "$fps32"; do
      name=$(basename "$init" .ckpt)
      federate --dataset $ds --data-root "$DATA" --download --init "$init" --seed $seed --device "$DEVICE" \
               --out "$OUT/t2-$ds-$name-s$seed"
      federate --dataset $ds --data-root "$DATA" --download --init "$init" --seed $seed --device "$DEVICE" \
               --centralized --out "$OUT/t2-$ds-$name-cl-s$seed"
    done
  done
  for ds in tinyimagenet inat-geo; do
    csv=(); [ $ds = inat-geo ] && csv=(--split-csv "$DATA/geo10k.csv")
    for init in random "$fps224" imagenet; do
      name=$(basename "$init" .ckpt)
      federate --dataset $ds --data-root "$DATA" "${csv[@]}" --arch resnet18 --init "$init" --seed $seed \
               --device "$DEVICE" --out "$OUT/t2-$ds-$name-s$seed"
      federate --dataset $ds --data-root "$DATA" "${csv[@]}" --arch resnet18 --init "$init" --seed $seed \
               --device "$DEVICE" --centralized --out "$OUT/t2-$ds-$name-cl-s$seed"
    done
  done
done
analyze report "$OUT"/t2-* --out "$OUT/table2"
