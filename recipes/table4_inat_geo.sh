#!/usr/bin/env bash
# Table 4 (Chen et al., ICLR 2023, §4.4): "Test accuracy on iNaturalist-GEO (Hsu et al., 2020)": GEO-10K,
# GEO-3K, Centralized and Avg. ΔCL-FL for Random, FPS and ImageNet initialisation.
# The paper's setting (§4.2, §4.4, Tables 1, 8 and 9): iNaturalist-2017, 1,203 classes, 120K training and
# 36K test images at 224 px, ResNet18; "the GEO-10K (39 clients and 50% clients per round) and GEO-3K (136
# clients and 20% clients per round) splits proposed by (Hsu et al., 2020)"; FedAvg 100 rounds x 5 local
# epochs, SGD lr 0.1, momentum 0.9, weight decay 1e-4, batch 128, lr x0.1 every 30 rounds. FPS: ResNet18,
# SimSiam on FPS pairs at 224 px, 100 epochs x 1M pairs. ImageNet: torchvision's ResNet18 weights.
# Data: INAT_IMAGES (the iNaturalist-2017 train_val_images/ tree with train2017.json and val2017.json),
# INAT_GEO10K / INAT_GEO3K (Hsu et al.'s federated_train_geo_*.csv, inaturalist-geo.zip) and INAT_TEST (its
# test.csv); see recipes/README.md. Images are decoded at 224 px batch by batch by DataLoader workers
# (federate --decode auto streams inat-geo).
# Departures: the centralised column trains on GEO-10K's training images (both splits hold the same images);
# images are resized (shorter side 224) and centre-cropped when decoded, so the training crop is drawn from
# that 224 px square, not from the full-size image as torchvision's ImageNet script does.
# GPU time (estimates, not measured): FPS ResNet18 at 224 px as in table3_tinyimagenet.sh (13-55 h); a
# federated round trains half of GEO-10K's (a fifth of GEO-3K's) 120K images 5 times at 224 px, not measured:
# 3 inits x (2 splits + CL) x 3 seeds = 27 runs.
source "$(dirname "$0")/common.sh"
fps=$(fps_ckpt resnet18 "$BIG")
inat=(--dataset inat-geo --data-root "$INAT_IMAGES" --test-csv "$INAT_TEST" --store-size "$BIG" --input-size "$BIG")
for seed in $SEEDS; do
    for init in random "$fps" imagenet; do
        run="$OUT/t4-$(label "$init")"
        fl "$run-geo10k-s$seed" "${inat[@]}" --split-csv "$INAT_GEO10K" --participation 0.5 --init "$init" \
            --seed "$seed"
        fl "$run-geo3k-s$seed" "${inat[@]}" --split-csv "$INAT_GEO3K" --participation 0.2 --init "$init" \
            --seed "$seed"
        fl "$run-cl-s$seed" "${inat[@]}" --split-csv "$INAT_GEO10K" --init "$init" --seed "$seed" --centralized
    done
done
report table4 "$OUT"/t4-*-s* --paper table4 --row "$(label "$fps")=FPS" \
    --departure "*/Centralised=trained on GEO-10K's training images; the paper does not say which"
