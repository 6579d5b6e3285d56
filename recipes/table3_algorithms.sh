#!/usr/bin/env bash
# Table 3: pre-training with other FL algorithms: FedAvg, FedProx, FedDyn, MOON, SCAFFOLD, FedNova (plus
# FedAvgM, FedVC, FedIR) from random vs FPS init, CIFAR-10, 10 clients, Dir(0.3), 100 rounds x 5 epochs.
# GPU time (estimate, not measured): 9 algorithms x 2 inits x 3 seeds = 54 CIFAR-10 runs of 500 epochs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet20 32)
for seed in $SEEDS; do
  for algo in fedavg fedprox feddyn moon scaffold fednova fedavgm fedvc fedir; do
    for init in random "$fps"; do
      federate --dataset cifar10 --data-root "$DATA" --download --algo $algo --init "$init" --seed $seed \
               --device "$DEVICE" --out "$OUT/t3-$algo-$(basename "$init" .ckpt)-s$seed"
    done
  done
done
analyze report "$OUT"/t3-* --out "$OUT/table3"
