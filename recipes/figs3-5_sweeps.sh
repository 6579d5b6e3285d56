#!/usr/bin/env bash
# Figs. 3-5: accuracy curves of random vs FPS init (Fig. 3), the gain across non-IID degrees α (Fig. 4)
# and across ResNet widths (Fig. 5), CIFAR-10, 10 clients, 100 rounds x 5 local epochs.
# GPU time (estimate, not measured): 2 + 8 + 8 CIFAR-10 runs, plus one pre-training per width.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet20 32)
for init in random "$fps"; do
  name=$(basename "$init" .ckpt)
  for a in 0.1 0.3 1.0 100; do
    federate --dataset cifar10 --data-root "$DATA" --download --alpha $a --init "$init" --device "$DEVICE" \
             --out "$OUT/f4-a$a-$name"
  done
done
for w in 0.5 1 2 4; do
  ckpt="$OUT/fps-resnet20-w$w.ckpt"
  [ -f "$ckpt" ] || pretrain fps --arch resnet20 --width $w --size 32 --epochs 100 --pairs-per-epoch 1000000 \
      --batch-size 256 --amp --device "$DEVICE" --out "$ckpt"
  for init in random "$ckpt"; do
    federate --dataset cifar10 --data-root "$DATA" --download --width $w --init "$init" --device "$DEVICE" \
             --out "$OUT/f5-w$w-$(basename "$init" .ckpt)"
  done
done
analyze report "$OUT"/f4-* --out "$OUT/fig4"      # accuracy per α (the runs of α = 0.3 are Fig. 3's curves)
analyze report "$OUT"/f5-* --out "$OUT/fig5"
