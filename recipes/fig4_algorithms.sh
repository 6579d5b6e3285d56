#!/usr/bin/env bash
# Fig. 4 (Chen et al., ICLR 2023, §4.3): "Pre-training for different FL methods": FedAvg, FedProx (Li et al.
# 2020b), FedDyn (Acar et al. 2021) and MOON (Li et al. 2021) from random, FPS (middle bars) and real
# (right bars: ImageNet32 ResNet20) initialisation, "using the default federated setting" (§4.3 names no
# dataset; our reading: CIFAR-10, 10 clients, Dir(0.3) as the paper splits it, full participation, 100
# rounds x 5 local epochs, ResNet20, Table 9's SGD).
# Each method's own setting is fpsfl's default (federate --help); Chen et al. do not give theirs: FedProx
# mu 0.01 (NIID-Bench's grid {0.001, 0.01, 0.1, 1}), FedDyn alpha 0.01, MOON mu 5 (MOON's CIFAR-10 value)
# and tau 0.5 (MOON's).
# EXTRA=1 (the default at SCALE=smoke) adds five algorithms the figure does not have, each under its own
# paper's definition: SCAFFOLD (Karimireddy et al. 2020, option II), FedNova (Wang et al. 2020), FedAvgM
# (Hsu et al. 2019: Nesterov server momentum 0.9, server lr 1), FedVC (Hsu et al. 2020: N_VC examples
# resampled once per selected round; N_VC = the mean client size) and FedIR (Hsu et al. 2020).
# Departures: SCAFFOLD's option II divides by FedNova's momentum-aware step count a(K, 0.9), not K: with
# K and the paper's local momentum 0.9 the control variates grow every round until training collapses (10%
# on digits, federated/algorithms/scaffold.py); --set steps=plain gives option II as written. SCAFFOLD's
# corrected gradient also goes through the momentum step (NIID-Bench's Algorithm 2: plain SGD; --momentum 0),
# FedNova's a_i is Wang et al.'s momentum-aware one (NIID-Bench divides by tau_i), and FedIR's p(y) is the
# clients' pooled class distribution, not a server-side target.
# The figure's numbers are not in the text: `analyze report` prints one table per algorithm.
# GPU time (estimates from bench/gpu-results, not measured): about 2 h per run (70 s a round); 4 methods x
# 3 inits x 3 seeds = 36 runs (EXTRA=1: 81).
source "$(dirname "$0")/common.sh"
ALGOS=${ALGOS:-fedavg fedprox feddyn moon}
EXTRA=${EXTRA:-$([ "$SCALE" = smoke ] && echo 1 || echo 0)}
[ "$EXTRA" = 1 ] && ALGOS="$ALGOS scaffold fednova fedavgm fedvc fedir"
fps=$(fps_ckpt resnet20 32)
real=$(imagenet32_ckpt)
for seed in $SEEDS; do
    for algo in $ALGOS; do
        for init in random "$fps" "$real"; do
            fl "$OUT/f4-$algo-$(label "$init")-s$seed" "${C10[@]}" --alpha 0.3 --algo "$algo" --init "$init" \
                --seed "$seed"
        done
    done
done
report fig4 "$OUT"/f4-*
