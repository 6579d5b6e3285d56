#!/usr/bin/env bash
# Federated self-pre-training at CPU scale on natural images (Chen et al. §5, Table 7; issue 32).
# The 2,543-image CIFAR-10 probe set as an image folder, 10 clients at Dir(0.1), ResNet20, per seed and per
# init (random, the shipped FPS weights):
#   1. SP: `federate self-pretrain` (Orchestra, App. B.3 settings) for SP_ROUNDS rounds -> sp.ckpt;
#   2. `analyze probe` of sp.ckpt (kNN / linear probe of the frozen backbone; the random init beside it);
#   3. FedAvg from sp.ckpt for FT_ROUNDS rounds;
#   4. the control: FedAvg from the same init for SP_ROUNDS + FT_ROUNDS rounds without SP.
# Then bench/selfpretrain_table.py prints the table (mean ± std over the seeds). Each step is skipped when
# its output exists (a FedAvg run: when it has the round needed, so a longer run serves a shorter
# comparison: rounds do not depend on the total while the lr has not decayed, 30 rounds), so the script
# continues where it stopped; a killed run continues with --resume. Random init first, all seeds, then FPS.
# Usage: bash bench/selfpretrain.sh OUT [SEEDS]   (DATA=folder, SP_ROUNDS=5, FT_ROUNDS=5, DEVICE=cpu, INITS="random
#   fps-mocov2-resnet20-cpu-1m": two shells with one init each, on the same OUT, run the two arms side by side)
set -euo pipefail
out=${1:?usage: bash bench/selfpretrain.sh OUT [SEEDS]}
seeds=${2:-0 1 2}
data=${DATA:-../shared/data/cifar10-probe}
sp_rounds=${SP_ROUNDS:-5}
ft_rounds=${FT_ROUNDS:-5}
device=${DEVICE:-cpu}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
mkdir -p "$out"
common=(--dataset imagefolder --data-root "$data" --arch resnet20 --input-size 32 --alpha 0.1 --clients 10 --device "$device"
        --quiet)  # ResNet20 at 32 px: the shipped FPS weights' backbone (imagefolder's default is ResNet18)
has_round() {  # has_round RUN_DIR N: its metrics.jsonl records round N
    [ -f "$1/metrics.jsonl" ] && grep -q "^{\"round\": $2," "$1/metrics.jsonl"
}
step() {  # step DONE RUN_DIR COMMAND...: run (or --resume) COMMAND unless DONE (a file, or RUN_DIR:ROUND)
    local done=$1 dir=$2; shift 2
    case $done in
        *:*) has_round "${done%:*}" "${done##*:}" && return 0 ;;
        *) [ -e "$done" ] && return 0 ;;
    esac
    local resume=(); [ -e "$dir/state.pt" ] && resume=(--resume)
    echo "$(date +%T) $*" >&2
    "$@" "${resume[@]}"
}
fps=$(dirname "$0")/../weights/fps-mocov2-resnet20-cpu-1m.ckpt
step "$out/probe-fps/probe.json" /nonexistent analyze probe "$fps" --dataset imagefolder --data-root "$data" \
    --input-size 32 --device "$device" --out "$out/probe-fps"
for init in ${INITS:-random fps-mocov2-resnet20-cpu-1m}; do
    for seed in $seeds; do
        name=$init-s$seed
        step "$out/sp-$name.ckpt" "$out/sp-$name.run" federate self-pretrain "${common[@]}" --seed "$seed" \
            --init "$init" --rounds "$sp_rounds" --out "$out/sp-$name.ckpt"
        step "$out/probe-$name/probe.json" /nonexistent analyze probe "$out/sp-$name.ckpt" --dataset imagefolder \
            --data-root "$data" --input-size 32 --seed "$seed" --device "$device" --out "$out/probe-$name"
        step "$out/ft-sp-$name:$ft_rounds" "$out/ft-sp-$name" federate "${common[@]}" --seed "$seed" \
            --init "$out/sp-$name.ckpt" --rounds "$ft_rounds" --no-eval-local --out "$out/ft-sp-$name"
        step "$out/ft-$name:$((sp_rounds + ft_rounds))" "$out/ft-$name" federate "${common[@]}" --seed "$seed" --init "$init" \
            --rounds $((sp_rounds + ft_rounds)) --no-eval-local --out "$out/ft-$name"
    done
done
python "$(dirname "$0")/selfpretrain_table.py" "$out" "$ft_rounds" "$((sp_rounds + ft_rounds))"
