#!/usr/bin/env bash
# Pre-training budget study (no paper publishes one): does FPS pre-training get better with more pairs?
# For each budget (FPS pairs seen), SimSiam pre-training of ResNet20 at 32 px (4 epochs, batch 256, the
# official recipe's other settings), over BUDGET_SEEDS for the budgets up to SMALL (3 seeds: the probes'
# spread), seed 0 above; each checkpoint's kNN and linear probes on PROBE_DATA (an image folder of natural
# images, e.g. ../shared/data/cifar10-probe, when given) and on digits, with the run's RankMe; and, with
# FEDAVG=1, FedAvg on digits from each checkpoint in the demo's setting (Dir(0.3), 10 clients, 10 rounds,
# 1 local epoch) over SEEDS, random init as the baseline.
# CPU time (2-vCPU VM, one thread per run, the official heads): about 250-300 pairs/s, so 8K and 32K pairs
# take 1-3 min, 131K about 8 min and 524K about 35 min; two runs at a time use both cores.
# SCALE=smoke: budgets of 256 and 512 pairs, one seed (the commands, not the curve).
source "$(dirname "$0")/common.sh"
[ "$SCALE" = smoke ] && BUDGETS=${BUDGETS:-"256 512"} BUDGET_SEEDS=${BUDGET_SEEDS:-0}
BUDGETS=${BUDGETS:-"8192 32768 131072 524288"}
BUDGET_SEEDS=${BUDGET_SEEDS:-"0 1 2"}
SMALL=${SMALL:-32768}
PROBE_DATA=${PROBE_DATA:-}
FEDAVG=${FEDAVG:-0}
fedavg() {  # fedavg INIT NAME SEED
    local out="$OUT/budget-fl-$2-s$3" resume=()
    started "$out" && resume=(--resume)  # an interrupted study continues; a finished run is checked again
    federate "${resume[@]}" --dataset digits --alpha 0.3 --clients 10 --rounds 10 --local-epochs 1 \
        --init "$1" --seed "$3" --no-eval-local --device "$DEVICE" --quiet --out "$out"
}
pretrain_budget() {  # pretrain_budget PAIRS SEED -> checkpoint path (a finished run resumes to no work)
    local out="$OUT/budget-$1-s$2.ckpt" resume=()
    started "$OUT/budget-$1-s$2.run" && resume=(--resume)
    pretrain fps "${resume[@]}" --arch resnet20 --size 32 --epochs 4 --pairs-per-epoch $(($1 / 4)) \
        --batch-size 256 --seed "$2" --device "$DEVICE" --quiet --out "$out" >&2
    echo "$out"
}
ckpts=()
for pairs in $BUDGETS; do
    seeds=0; [ "$pairs" -le "$SMALL" ] && seeds=$BUDGET_SEEDS
    for s in $seeds; do ckpts+=("$(pretrain_budget "$pairs" "$s")"); done
    if [ "$FEDAVG" = 1 ]; then for seed in $SEEDS; do fedavg "$OUT/budget-$pairs-s0.ckpt" "$pairs" "$seed"; done; fi
done
runs=()
if [ "$FEDAVG" = 1 ]; then
    for seed in $SEEDS; do fedavg random random "$seed"; done
    runs=(--runs "$OUT"/budget-fl-*)
fi
analyze budget --force "${ckpts[@]}" "${runs[@]}" --device "$DEVICE" --out "$OUT/budget-digits"
if [ -n "$PROBE_DATA" ]; then
    analyze budget --force "${ckpts[@]}" --dataset imagefolder --data-root "$PROBE_DATA" --input-size 32 \
        --device "$DEVICE" --out "$OUT/budget-natural"
fi
