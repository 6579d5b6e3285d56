#!/usr/bin/env bash
# Table 6 (Chen et al., ICLR 2023, §4.5) and Table 12 (App. C.3): synthetic pre-training. FedAvg test accuracy
# on CIFAR-10 and CIFAR-100 (α = 0.1) and Tiny-ImageNet (α = 0.3) from Random, Fractal + Multi-label,
# StyleGAN + SimSiam, Fractal + SimSiam and FPS + SimSiam (Table 6), plus StyleGAN / Fractal / FPS + MoCo-V2
# and ImageNet / Places365 (Table 12); "means of 3 runs".
# The paper's setting: "M = 10 clients and full participation", Dir(α) as §4.2 splits it (--balance none,
# common.sh), otherwise §4.2 (ResNet20 at 32 px for CIFAR,
# ResNet18 at 64 px for Tiny-ImageNet, 100 rounds x 5 local epochs, Table 9's SGD). Every pre-training "the
# same setup" (App. A.2): 100 epochs, batch 256; SimSiam lr 0.05, MoCo-V2 lr 0.03 with a 65,536-key
# dictionary, both cosine; FPS pairs and fractals rendered on the fly (1M a epoch; 32 px for ResNet20, 224 px
# for ResNet18); multi-label "J = 1K IFS codes"; StyleGAN: "the pre-generated StyleGAN dataset provided in
# Baradad et al. (2021), which has 1.3M images" (STYLEGAN, an image folder). ImageNet / Places365: the
# ResNet20 pre-trained on 32 px ImageNet (table2_cifar10.sh) for CIFAR, Places365's ResNet18 for Tiny.
# Departures: the ImageNet32 recipe as in table2_cifar10.sh; StyleGAN's 100 epochs are over its 1.3M
# images (1.3x FPS's pairs), the paper not saying how many it ran.
# GPU time (estimates from bench/gpu-results, not measured): 7 pre-trainings of ResNet20 at 32 px, 4-5 h
# each for the fractal ones; 7 of ResNet18 at 224 px, 13-55 h each; 3 datasets x 9 inits x 3 seeds = 81
# federated runs, the CIFAR ones about 2 h each.
source "$(dirname "$0")/common.sh"

synthetic() {  # synthetic KIND METHOD ARCH SIZE -> the checkpoint of that pre-training
    local kind=$1 method=$2 arch=$3 size=$4 ckpt="$OUT/pretrain/$1-$2-$3-$4.ckpt"
    case $kind in
        fps) fps_ckpt "$arch" "$size" "$method" ;;
        fractal) pretrained "$ckpt" "$PT_EPOCHS" fractal-simsiam --method "$method" --recipe "$PT_RECIPE" --arch "$arch" --size "$size" \
                     "${PT_FRACTAL[@]}" ;;
        multilabel) pretrained "$ckpt" "$PT_EPOCHS" multilabel --classes 1000 --arch "$arch" --size "$size" \
                        "${PT_FRACTAL[@]}" ;;
        stylegan) pretrained "$ckpt" "$FOLDER_EPOCHS" images --root "$STYLEGAN" --method "$method" --arch "$arch" \
                      --recipe "$PT_RECIPE" --size "$size" --batch-size "$PT_BATCH" ;;
    esac
}

rows=()  # --row LABEL=ROW for analyze report
inits() {  # inits ARCH SIZE REAL -> "key=init" lines: the rows of Table 12 for one backbone
    local arch=$1 size=$2 real=$3 kind method ckpt
    echo "random=random"
    ckpt=$(synthetic multilabel multilabel "$arch" "$size")
    echo "multilabel=$ckpt"
    for method in simsiam mocov2; do
        for kind in stylegan fractal fps; do
            ckpt=$(synthetic "$kind" "$method" "$arch" "$size")
            echo "$kind-$method=$ckpt"
        done
    done
    echo "real=$real"
}
declare -A ROW=([random]=Random [multilabel]="Fractal + Multi-label" [stylegan-simsiam]="StyleGAN + SimSiam"
                [fractal-simsiam]="Fractal + SimSiam" [fps-simsiam]="FPS + SimSiam"
                [stylegan-mocov2]="StyleGAN + MoCo-V2" [fractal-mocov2]="Fractal + MoCo-V2"
                [fps-mocov2]="FPS + MoCo-V2" [real]="ImageNet / Places365")
small=$(inits resnet20 32 "$(imagenet32_ckpt)")
large=$(inits resnet18 "$BIG" "places365:$PLACES365")
for seed in $SEEDS; do
    for dataset in cifar10 cifar100 tinyimagenet; do
        case $dataset in
            cifar10) data=("${C10[@]}" --alpha 0.1) lines=$small ;;
            cifar100) data=("${C100[@]}" --alpha 0.1) lines=$small ;;
            tinyimagenet) data=("${TINY[@]}" --alpha 0.3) lines=$large ;;
        esac
        while IFS== read -r key init; do
            fl "$OUT/t6-$dataset-$key-s$seed" "${data[@]}" --init "$init" --seed "$seed"
            rows+=(--row "$(label "$init")=${ROW[$key]}")
        done <<< "$lines"
    done
done
simsiam='{random,multilabel,stylegan-simsiam,fractal-simsiam,fps-simsiam}'
eval "report table6 \"\$OUT\"/t6-*-$simsiam-s* --paper table6 \"\${rows[@]}\""
report table12 "$OUT"/t6-*-s* --paper table12 "${rows[@]}"
