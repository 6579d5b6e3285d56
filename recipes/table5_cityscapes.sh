#!/usr/bin/env bash
# Table 5: Cityscapes segmentation, DeepLabV3+ with a MobileNetV2 encoder, 18 cities as clients; random,
# FPS (MobileNetV2, 224 px) and ImageNet init; federated and centralised (mIoU).
# GPU time (estimate, not measured): 100 rounds x 5 local epochs over 2,975 images at 768 px crops, six runs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt mobilenet_v2 224)
for init in random "$fps" imagenet; do
  name=$(basename "$init" .ckpt)
  federate --dataset cityscapes --data-root "$DATA/cityscapes" --init "$init" --device "$DEVICE" \
           --out "$OUT/t5-$name"
  federate --dataset cityscapes --data-root "$DATA/cityscapes" --init "$init" --device "$DEVICE" \
           --centralized --out "$OUT/t5-$name-cl"
done
analyze report "$OUT"/t5-* --out "$OUT/table5"
