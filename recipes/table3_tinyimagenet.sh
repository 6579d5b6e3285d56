#!/usr/bin/env bash
# Table 3 (Chen et al., ICLR 2023, §4.3): "Test accuracy on Tiny-ImageNet (α = 0.3)": Federated, Centralized
# and ΔCL-FL for Random, FPS and Places365 initialisation.
# The paper's setting (§4.2, Tables 1, 8 and 9, App. B.1): ResNet18 on 64 x 64 images; 10 clients, Dir(0.3),
# 100% participation; FedAvg, 100 rounds x 5 local epochs, SGD lr 0.01, momentum 0.9, weight decay 1e-4,
# batch 32, lr x0.1 every 30 rounds; random-resized crop + flip ("the official PyTorch ImageNet training
# script"). FPS: ResNet18 pre-trained with SimSiam on FPS pairs rendered at 224 px (I ~ U{2..5}, 100K IFS
# iterations), 100 epochs x 1M pairs (§4.2, App. A.2). Real: "for downstream FL tasks derived from ImageNet
# (e.g., Tiny-ImageNet), we use weights pre-trained on Places365 (Zhou et al., 2017) to prevent data
# leakage" (§4.1): the Places365 project's resnet18_places365.pth.tar (--init places365:FILE).
# Departures: the centralised column trains 500 epochs on the pooled clients (the FL runs' 100 x 5 local
# epochs); the paper does not state its centralised budget. Dir(0.3) is the paper's plain split (--balance
# none, common.sh). (The FPS and Places365 ResNet18s were trained at 224 px and are fine-tuned at 64 px,
# as the paper's tables give 64^2 for Tiny-ImageNet.)
# GPU time (estimates from bench/gpu-results, one H100, not measured for this recipe): FPS ResNet18 at
# 224 px, 100M pairs at 500 pairs/s with 4 render workers (renderer-bound; the model alone 1,600-2,200) =
# 55 h (13-17 h with a renderer that keeps up; the paper: "2-3 days" on an A6000); federated runs: ResNet18
# at 64 px on 98K images, not measured: 18 runs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet18 "$BIG")
places="places365:$PLACES365"
for seed in $SEEDS; do
    for init in random "$fps" "$places"; do
        run="$OUT/t3-$(label "$init")-s$seed"
        fl "$run" "${TINY[@]}" --alpha 0.3 --init "$init" --seed "$seed"
        fl "$run-cl" "${TINY[@]}" --alpha 0.3 --init "$init" --seed "$seed" --centralized
    done
done
report table3 "$OUT"/t3-*-s* --paper table3 --row "$(label "$fps")=FPS" \
    --departure "*/Centralised=500 epochs on the pooled clients (100 rounds x 5 local epochs' worth); the paper does not state its centralised budget"
