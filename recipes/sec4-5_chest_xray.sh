#!/usr/bin/env bash
# §4.5 (Chen et al., ICLR 2023), "privacy-critical domain": chest X-ray diagnosis (Kermany et al., 2018).
# "Under the same setup as in subsection 4.3 (α = 0.3, M = 10, full participation), FedAvg initialized with
# random/FPS/ImageNet achieves 68.9/74.8/69.1% test accuracy."
# Setting: CHEST_XRAY holds Kermany et al.'s chest_xray/{train,test}/{NORMAL,PNEUMONIA}/ (federate --dataset
# imagefolder); 10 clients, Dir(0.3), full participation, 100 rounds x 5 local epochs, SGD lr 0.01, batch
# 32 (the CIFAR / Tiny-ImageNet recipe of Table 9). Model: ResNet18 at 224 px (the text names no network; an
# ImageNet init of torchvision's ResNet18 and FPS at 224 px are the paper's ResNet18 setting), images held at
# 224 px (5,856 X-rays: 0.9 GB).
# Dir(0.3) as §4.2 splits it (--balance none, common.sh).
# Departures: the network and resolution are our reading (above). Only federated numbers are in the paper.
# GPU time (estimates, not measured): FPS ResNet18 at 224 px as in table3_tinyimagenet.sh (13-55 h); 3 inits
# x 3 seeds = 9 runs on 5K images.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet18 "$BIG")
for seed in $SEEDS; do
    for init in random "$fps" imagenet; do
        fl "$OUT/x-$(label "$init")-s$seed" --dataset imagefolder --data-root "$CHEST_XRAY" --arch resnet18 \
            --store-size "$BIG" --input-size "$BIG" --alpha 0.3 --init "$init" --seed "$seed"
    done
done
report sec4-5 "$OUT"/x-*-s* --paper sec4.5 --row "$(label "$fps")=FPS" \
    --departure "*/Federated=ResNet18 at 224 px is our reading; the paper does not name the network"
