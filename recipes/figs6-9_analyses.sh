#!/usr/bin/env bash
# Figs. 6-9 (§6): training dynamics (Fig. 6), FedAvg vs optimal convex aggregation and λ* as the
# aggregation (Fig. 7), loss variance over λ (Fig. 8) and loss landscapes (Fig. 9), random vs FPS init on
# CIFAR-10, 10 clients, Dir(0.3). convex and variance are oracle analyses on the test set, as in the paper.
# GPU time (estimate, not measured): four CIFAR-10 runs, each tracked round adding 300 test-set passes
# (variance) and 60 search epochs over the test set (convex); landscapes: 441 evaluations of 2,000 images.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet20 32)
for init in random "$fps"; do
  name=$(basename "$init" .ckpt)
  federate --dataset cifar10 --data-root "$DATA" --download --init "$init" --track convex,variance \
           --track-every 10 --device "$DEVICE" --out "$OUT/f6-$name"
  federate --dataset cifar10 --data-root "$DATA" --download --init "$init" --aggregation optimal-convex \
           --device "$DEVICE" --out "$OUT/f7-oc-$name"
  for a in 0.1 1.0; do
    federate --dataset cifar10 --data-root "$DATA" --download --alpha $a --init "$init" --device "$DEVICE" \
             --out "$OUT/f9-a$a-$name"
  done
done
analyze dynamics "$OUT/f6-random" "$OUT/f6-fps-resnet20-32" --out "$OUT/fig6"
analyze convex "$OUT/f6-random" "$OUT/f6-fps-resnet20-32" --out "$OUT/fig7"
analyze variance "$OUT/f6-random" "$OUT/f6-fps-resnet20-32" --out "$OUT/fig8"
for name in random fps-resnet20-32; do
  analyze landscape "$OUT/f9-a0.1-$name" "$OUT/f6-$name" "$OUT/f9-a1.0-$name" --device "$DEVICE" \
          --out "$OUT/fig9-$name"
done
