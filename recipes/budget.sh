#!/usr/bin/env bash
# Pre-training budget study (no paper publishes one): how much FPS pre-training does FedAvg need?
# For each budget (FPS pairs seen), SimSiam pre-training of ResNet20 at 32 px (4 epochs, batch 256, the
# paper's other settings), its kNN and linear probes on digits, and FedAvg on digits from it over SEEDS,
# in the demo's setting (Dir(0.3), 10 clients, 10 rounds, 1 local epoch); random init is the baseline.
# CPU time (measured on the 2-vCPU development VM): about 90 pairs/s per core for the pre-training and
# 75 s per FedAvg run on one core; BUDGETS="8192 32768" takes about 15 minutes, 524288 pairs about 1.6 h more.
source "$(dirname "$0")/common.sh"
BUDGETS=${BUDGETS:-"8192 32768 131072 524288"}
fedavg() {  # fedavg INIT NAME SEED
    local out="$OUT/budget-fl-$2-s$3" resume=()
    [ -f "$out/config.json" ] && resume=(--resume)  # an interrupted study continues where it stopped
    [ -f "$out/final.pt" ] || federate "${resume[@]}" --dataset digits --alpha 0.3 --clients 10 --rounds 10 --local-epochs 1 \
        --init "$1" --seed "$3" --no-eval-local --device "$DEVICE" --quiet --out "$out"
}
ckpts=()
for pairs in $BUDGETS; do
    ckpt="$OUT/budget-$pairs.ckpt"
    [ -f "$ckpt" ] || pretrain fps --arch resnet20 --size 32 --epochs 4 --pairs-per-epoch $((pairs / 4)) \
        --batch-size 256 --device "$DEVICE" --probe digits --quiet --out "$ckpt"
    ckpts+=("$ckpt")
    for seed in $SEEDS; do fedavg "$ckpt" "$pairs" "$seed"; done
done
for seed in $SEEDS; do fedavg random random "$seed"; done
analyze budget "${ckpts[@]}" --runs "$OUT"/budget-fl-* --device "$DEVICE" --out "$OUT/budget"
