#!/usr/bin/env bash
# Fig. 5 (Chen et al., ICLR 2023, §4.3): "Deeper/wider ResNet": "On CIFAR-10 (α = 0.3), we study different
# network depths and widths based on ResNet20", random vs FPS vs real (ImageNet32) initialisation, each
# backbone pre-trained as its ResNet20 (Table 8: ResNet{20, 32, 44, 56}). Otherwise the default setting:
# 10 clients, full participation, 100 rounds x 5 local epochs, Table 9's SGD; Dir(0.3) as §4.2 splits it
# (--balance none, common.sh).
# Departures: the widths are not in the text; the recipe runs ResNet20 x{1, 2, 4} beside depths 20, 32, 44
# and 56 at width 1. The figure's numbers are not in the text.
# GPU time (estimates from bench/gpu-results, not measured): 6 backbones x 2 pre-trainings (FPS 4-5 h for
# ResNet20, more for the larger ones); 6 x 3 inits x 3 seeds = 54 runs of 2 h or more.
source "$(dirname "$0")/common.sh"
if [ "$SCALE" = smoke ]; then DEPTHS=${DEPTHS:-"20 32"} WIDTHS=${WIDTHS:-"2"}; fi
DEPTHS=${DEPTHS:-"20 32 44 56"}
WIDTHS=${WIDTHS:-"2 4"}                  # besides 1
nets=()
for d in $DEPTHS; do nets+=("resnet$d:1"); done
for w in $WIDTHS; do nets+=("resnet20:$w"); done
for net in "${nets[@]}"; do
    arch=${net%:*} width=${net#*:}
    fps=$(fps_ckpt "$arch" 32 simsiam "$width")
    real=$(imagenet32_ckpt "$arch" "$width")
    for seed in $SEEDS; do
        for init in random "$fps" "$real"; do
            kind=$([ "$init" = random ] && echo random || basename "$init" | cut -d- -f1)
            fl "$OUT/f5-$arch-w$width-$kind-s$seed" "${C10[@]}" --alpha 0.3 --arch "$arch" --width "$width" \
                --init "$init" --seed "$seed"
        done
    done
done
report fig5 "$OUT"/f5-*
