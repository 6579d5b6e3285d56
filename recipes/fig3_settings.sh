#!/usr/bin/env bash
# Fig. 3 (Chen et al., ICLR 2023, §4.3, App. C.4): "Comparison of model initialization across different
# federated settings": (a) #clients M, (b) Dir(α) non-IID degree, (c) participation (%), (d) local epochs a
# round, on CIFAR-10 and Tiny-ImageNet, random vs FPS vs real pre-training (ImageNet32 ResNet20 for CIFAR-10,
# Places365 ResNet18 for Tiny-ImageNet). "The default setting is 10 clients, α = 0.3, 100% participation, and
# 5 local epochs, and we change one variable at a time"; for local epochs "keep the total local epochs in
# FedAvg as 500" (rounds = 500 / E); "three times of experiments and report the mean and standard deviation".
# Otherwise §4.2 and Table 9 (ResNet20 at 32 px / ResNet18 at 64 px, SGD lr 0.01, batch 32).
# Departures: the figure's grids are not in the text; the recipe's span Table 1's client ranges (CIFAR
# 10-100, Tiny-ImageNet 10-1000): M in {10, 30, 100} (Tiny: {10, 100, 1000}), α in {0.1, 0.3, 1, 10},
# participation in {10, 30, 50, 100}% of the 10 clients, E in {1, 2, 5, 10} (500, 250, 100, 50 rounds).
# The E sweep keeps the total decay: x0.1 every 150 local epochs (--lr-decay-every 150/E rounds: 3 decays in
# every run, as the default's every 30 rounds of 100); the paper does not say how its schedule scaled.
# Tiny-ImageNet with 100 or more clients samples 10% of them a round (Table 9: "100%/10%" for Tiny-ImageNet,
# Table 8's 10 / 100 clients); the text does not give M = 1000's rate, and 10% is our reading.
# Dir(alpha) is the paper's plain split (--balance none, common.sh).
# The figure's numbers are not in the text: `analyze report` prints the measured table per setting.
# GPU time (estimates from bench/gpu-results, not measured): about 2 h per CIFAR-10 run (500 local epochs,
# 70 s a round of 5); 2 datasets x 13 settings x 3 inits x 3 seeds = 234 runs.
source "$(dirname "$0")/common.sh"
if [ "$SCALE" = smoke ]; then
    CLIENTS_C10=20 CLIENTS_TINY=20 ALPHAS=0.1 PARTICIPATION=0.5 EPOCHS=2  # one point off the default each
else
    CLIENTS_C10="10 30 100" CLIENTS_TINY="10 100 1000" ALPHAS="0.1 0.3 1.0 10" PARTICIPATION="0.1 0.3 0.5 1.0"
    EPOCHS="1 2 5 10"
fi
TOTAL=$((ROUNDS * LOCAL_EPOCHS))  # 500 local epochs (§4.3)
DECAY_EPOCHS=$((30 * LOCAL_EPOCHS))  # local epochs between lr decays: App. B.1's 30 rounds of 5
fps20=$(fps_ckpt resnet20 32) fps18=$(fps_ckpt resnet18 "$BIG") real20=$(imagenet32_ckpt)
for seed in $SEEDS; do
    for dataset in cifar10 tinyimagenet; do
        if [ "$dataset" = cifar10 ]; then
            data=("${C10[@]}") inits=(random "$fps20" "$real20") clients=$CLIENTS_C10
        else
            data=("${TINY[@]}") inits=(random "$fps18" "places365:$PLACES365") clients=$CLIENTS_TINY
        fi
        for init in "${inits[@]}"; do
            run() { fl "$OUT/f3-$dataset-$1-$(label "$init")-s$seed" "${data[@]}" --alpha 0.3 --init "$init" \
                       --seed "$seed" "${@:2}"; }
            for m in $clients; do
                rate=1.0
                [ "$dataset" = tinyimagenet ] && [ "$m" -ge 100 ] && rate=0.1  # Table 9: 100%/10%
                run "m$m" --clients "$m" --participation "$rate"
            done
            for a in $ALPHAS; do run "a$a" --alpha "$a"; done
            for p in $PARTICIPATION; do run "p$p" --participation "$p"; done
            for e in $EPOCHS; do  # the same total decay at every E: x0.1 every 150 local epochs
                run "e$e" --local-epochs "$e" --rounds $((TOTAL / e)) --lr-decay-every $((DECAY_EPOCHS / e))
            done
        done
    done
done
report fig3-cifar10 "$OUT"/f3-cifar10-*
report fig3-tinyimagenet "$OUT"/f3-tinyimagenet-*
