#!/usr/bin/env bash
# Table 2 (Chen et al., ICLR 2023, §4.3): "Test accuracy on CIFAR-10 (α = 0.3)": Federated, Centralized and
# ΔCL-FL for Random, FPS and ImageNet initialisation.
# The paper's setting (§4.2, Table 9, App. B.1): ResNet20 at 32 px; 10 clients, Dir(0.3), 100% participation;
# FedAvg, 100 rounds x 5 local epochs, SGD lr 0.01, momentum 0.9, weight decay 1e-4, batch 32, lr x0.1 every
# 30 rounds; 2% of the training set held out; images "padded 2 pixels on each side, randomly flipped
# horizontally, and then randomly cropped back to 32 x 32". FPS: SimSiam on FPS pairs (I = 2, 1K IFS iterations at 32 px), 100 epochs x 1M pairs, batch 256,
# lr 0.05, cosine (App. A.2). ImageNet: "for ResNet20, we pre-train the weights using down-sampled, 32 x 32
# ImageNet images" (§4.2), by "standard supervised training" (§4.1).
# Departures: the centralised column trains 500 epochs on the pooled clients (100 rounds x 5 local epochs'
# worth, with the same step decay); the paper does not state its centralised budget. The Dirichlet split
# is the paper's plain one (--balance none, common.sh). The ImageNet32 pre-training recipe is not in the paper; this one is supervised cross-entropy on
# Chrabaszcz et al.'s Imagenet32 train set, 40 epochs (their budget), batch 256, SGD lr 0.1, cosine.
# GPU time (estimates from bench/gpu-results, one H100, not measured for this recipe): FPS pre-training
# 100M pairs at 5,800-7,000 pairs/s = 4-5 h; ImageNet32 51M images of one view, about half a SimSiam pair's
# work, about 1 h; a federated run about 70 s a round (5 x the 14 s measured for E = 1, 10 clients
# vectorised) = 2 h, and a centralised one about as long: 3 inits x 2 x 3 seeds = 18 runs, about 36 h.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet20 32)
in32=$(imagenet32_ckpt)
for seed in $SEEDS; do
    for init in random "$fps" "$in32"; do
        run="$OUT/t2-$(label "$init")-s$seed"
        fl "$run" "${C10[@]}" --alpha 0.3 --init "$init" --seed "$seed"
        fl "$run-cl" "${C10[@]}" --alpha 0.3 --init "$init" --seed "$seed" --centralized
    done
done
report table2 "$OUT"/t2-*-s* --paper table2 --row "$(label "$fps")=FPS" --row "$(label "$in32")=ImageNet" \
    --departure "*/Centralised=500 epochs on the pooled clients (100 rounds x 5 local epochs' worth); the paper does not state its centralised budget" \
    --departure "ImageNet/Federated=our ImageNet32 recipe (supervised, 40 epochs, lr 0.1, cosine); the paper gives none" \
    --departure "ImageNet/Centralised=our ImageNet32 recipe"
