#!/usr/bin/env bash
# Table 4: robustness to the FL setting on CIFAR-10: non-IID degree (Dir 0.1 / 0.3 / 1.0, IID), partial
# participation (10 of 100 clients) and local epochs (1 / 5), random vs FPS init.
# GPU time (estimate, not measured): 8 settings x 2 inits x 3 seeds CIFAR-10 runs of up to 500 epochs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet20 32)
for seed in $SEEDS; do
  for init in random "$fps"; do
    name=$(basename "$init" .ckpt)
    run() { federate --dataset cifar10 --data-root "$DATA" --download --init "$init" --seed $seed \
                     --device "$DEVICE" "$@"; }
    for a in 0.1 0.3 1.0; do run --alpha $a --out "$OUT/t4-a$a-$name-s$seed"; done
    run --partition iid --out "$OUT/t4-iid-$name-s$seed"
    run --clients 100 --participation 0.1 --out "$OUT/t4-p0.1-$name-s$seed"
    run --local-epochs 1 --out "$OUT/t4-e1-$name-s$seed"
    run --centralized --out "$OUT/t4-cl-$name-s$seed"
  done
done
analyze report "$OUT"/t4-* --out "$OUT/table4"
