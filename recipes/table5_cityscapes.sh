#!/usr/bin/env bash
# Table 5 (Chen et al., ICLR 2023, §4.4): "mIoU (%) of segmentation on Cityscapes": Federated, Centralized and
# ΔCL-FL for Random, FPS and ImageNet initialisation.
# The paper's setting (§4.2, Tables 1, 8 and 9, App. B.1): DeepLabV3+ with a MobileNet-V2 backbone, output
# stride 16; the 2,975 training images split into 18 clients by city, "full client participation at every
# round"; the 500 val images are the test set; FedAvg 100 rounds x 5 local epochs, Adam lr 0.001, batch 16,
# lr x0.1 every 30 rounds; training crops 768 x 768, testing at 2048 x 1024. FPS: MobileNet-V2 pre-trained
# with SimSiam on FPS pairs at 224 px, 100 epochs x 1M pairs. ImageNet: torchvision's MobileNet-V2 weights.
# Departures: the centralised column trains 500 epochs on the pooled clients (the FL runs' 100 x 5 local
# epochs); the paper does not state its centralised budget. The images are held in memory at full resolution (25 GB with the labels;
# --store-size 512 quarters it and changes the test resolution).
# GPU time (estimates, not measured): FPS MobileNet-V2 at 224 px of the order of the ResNet18 pre-training
# (13-55 h, table3_tinyimagenet.sh); the paper: "about 2 days" for this table's FL on an A6000; 3 inits x
# 2 x 3 seeds = 18 runs (SEEDS=0 runs one seed).
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt mobilenet_v2 "$BIG")
cityscapes=(--dataset cityscapes --data-root "$CITYSCAPES" "${CITYSCAPES_FLAGS[@]}")
for seed in $SEEDS; do
    for init in random "$fps" imagenet; do
        run="$OUT/t5-$(label "$init")-s$seed"
        fl "$run" "${cityscapes[@]}" --init "$init" --seed "$seed"
        fl "$run-cl" "${cityscapes[@]}" --init "$init" --seed "$seed" --centralized
    done
done
report table5 "$OUT"/t5-*-s* --paper table5 --row "$(label "$fps")=FPS" \
    --departure "*/Centralised=500 epochs on the pooled clients (100 rounds x 5 local epochs' worth); the paper does not state its centralised budget"
