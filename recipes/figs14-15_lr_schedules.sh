#!/usr/bin/env bash
# Figs. 14 and 15 (Chen et al., ICLR 2023, App. C.4): CIFAR-10 (Fig. 14) and Tiny-ImageNet (Fig. 15), "10
# clients, Dir(0.3), 100% participation, local epoch = 5", under three learning-rate schedules: x0.1 every 30
# rounds (the paper's default), x0.95 every round, and no decay; random vs pre-trained (ImageNet32 ResNet20 /
# Places365 ResNet18). Left: the global model's accuracy and the local models' mean per round; right: "the
# test loss variance of 100 sampled coefficients ... to combine the local models in each round".
# Otherwise §4.2 (100 rounds, ResNet20 at 32 px / ResNet18 at 64 px, Table 9's SGD; Dir(0.3) as §4.2 splits
# it, --balance none, common.sh).
# Departures: none known. The figures' numbers are not in the text.
# GPU time (estimates, not measured): 2 datasets x 3 schedules x 2 inits = 12 runs of about 2 h, plus 100
# test-set passes every round for the variance.
source "$(dirname "$0")/common.sh"
real20=$(imagenet32_ckpt)
samples=100
[ "$SCALE" = smoke ] && samples=8
for dataset in cifar10 tinyimagenet; do
    if [ "$dataset" = cifar10 ]; then data=("${C10[@]}") real=$real20; else data=("${TINY[@]}") real="places365:$PLACES365"; fi
    for init in random "$real"; do
        kind=$([ "$init" = random ] && echo random || echo real)
        for schedule in step exp none; do
            case $schedule in
                step) lr=(--lr-decay 0.1 --lr-decay-every 30) ;;
                exp) lr=(--lr-decay 0.95 --lr-decay-every 1) ;;
                none) lr=(--lr-decay 1.0) ;;
            esac
            fl "$OUT/f14-$dataset-$kind-$schedule" "${data[@]}" --alpha 0.3 --init "$init" "${lr[@]}" \
                --track variance --track-every 1 --variance-samples "$samples"
        done
    done
    analyze dynamics --force "$OUT"/f14-"$dataset"-* --out "$OUT/fig$([ "$dataset" = cifar10 ] && echo 14 || echo 15)-dynamics"
    analyze variance --force "$OUT"/f14-"$dataset"-* --out "$OUT/fig$([ "$dataset" = cifar10 ] && echo 14 || echo 15)-variance"
done
