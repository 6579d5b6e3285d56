#!/usr/bin/env bash
# What Flower costs over the in-process engine, where a deployed ClientApp spends its time, and what a lost
# SuperNode does (Beutel et al. 2020; issues 25 and 33). digits, 10 clients, Dir(0.3), 10 rounds, 1 local
# epoch, FedAvg, seed 0, no local evaluation, CPU:
#   1. in-process engine;  2. --engine flower (Flower's simulation runtime, Ray);
#   3. deployment: recipes/flower_deploy.sh as it ships: a SuperLink and 10 SuperNodes on loopback, TLS and
#      SuperNode authentication, each node on its own shard of `federate export-partitions`, its ClientApp
#      tasks run by its fpsfl executor (one long-lived process, --isolation process);
#   4. deployment-insecure: the same without TLS and authentication (what they cost);
#   5. deployment-worker: Flower's per-message flwr-clientapp processes, each handing its message to the
#      node's warm worker (RUNNER=worker);
#   6. deployment-cold: each message in a fresh flwr-clientapp process that imports torch, reads its shard
#      and builds its model (RUNNER=cold: the deployment before issue 33), COLD_ROUNDS rounds;
#   7. drill: the deployment with SuperNode 3 killed (SIGKILL) as round 3 starts and restarted as round 5
#      starts, --min-replies 0.8 --flower-timeout 90.
# One JSON line each (wall seconds, first round, mean of the later rounds, the rounds' missing clients), one
# comparing them (Flower's start-up and per-round overhead; a deployed round over a simulated one; the same
# test accuracies: the same code trains and aggregates), the ClientApp cold-start breakdown per phase (CPU
# and wall seconds, medians; bench/flower_summary.py), then bench/flower_bytes.py's bytes per round per
# algorithm. The machine's load (uptime) before and after is printed too: the figures are only worth
# quoting from a quiet machine.
# Usage: bash bench/flower.sh [ROUNDS]   (needs pip install -e ".[flower]"; DEPLOY=0 skips 3-7; COLD_ROUNDS
#   (default 3) for 5 and 6; DEVICE=cuda and FLOWER_RESOURCES=num_cpus=1,num_gpus=0.1 put the simulated clients
#   on the GPU). About 20 minutes on the 2-vCPU VM.
set -euo pipefail
rounds=${1:-10}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "{\"load_before\": \"$(uptime | sed 's/.*load average: //')\", \"cpus\": $(getconf _NPROCESSORS_ONLN)}"
settings=(--dataset digits --partition dirichlet --alpha 0.3 --clients 10 --seed 0)
for engine in inprocess flower; do
    start=$(date +%s.%N)
    federate "${settings[@]}" --rounds "$rounds" --local-epochs 1 --algo fedavg --no-eval-local \
        --device "${DEVICE:-cpu}" --engine "$engine" --flower-resources "${FLOWER_RESOURCES:-num_cpus=1,num_gpus=0}" \
        --out "$tmp/$engine" --quiet > /dev/null 2> "$tmp/$engine.err" || { cat "$tmp/$engine.err" >&2; exit 1; }
    echo "$start $(date +%s.%N)" > "$tmp/$engine.wall"
done
runs=(inprocess flower)
if [ "${DEPLOY:-1}" != 0 ]; then
    federate export-partitions "${settings[@]}" --out "$tmp/shards" --quiet > /dev/null
    config=(alpha=0.3 seed=0 local-epochs=1 "algo='fedavg'" eval-local=false "device='cpu'")
    for run in deployment deployment-insecure deployment-worker deployment-cold drill; do
        extra=("num-server-rounds=$rounds"); env_run=(PHASES=1 WORK="$tmp/$run-work")
        [ "$run" = deployment-insecure ] && env_run+=(SECURE=0)
        [ "$run" = deployment-worker ] && { extra=("num-server-rounds=${COLD_ROUNDS:-3}"); env_run+=(RUNNER=worker); }
        [ "$run" = deployment-cold ] && { extra=("num-server-rounds=${COLD_ROUNDS:-3}"); env_run+=(RUNNER=cold); }
        [ "$run" = drill ] && { extra+=(min-replies=0.8 flower-timeout=90); env_run=(KILL=3:3:5); }
        start=$(date +%s.%N)
        env CLIENTS=10 SHARDS="$tmp/shards" OMP_NUM_THREADS=1 "${env_run[@]}" bash "$here/../recipes/flower_deploy.sh" \
            "$tmp/$run" "${config[@]}" "${extra[@]}" > /dev/null 2> "$tmp/$run.err" || { cat "$tmp/$run.err" >&2; exit 1; }
        echo "$start $(date +%s.%N)" > "$tmp/$run.wall"
        runs+=("$run")
    done
fi
python "$here/flower_summary.py" "$tmp" "${runs[@]}"
python "$here/flower_bytes.py" scaffold moon fedavg
echo "{\"load_after\": \"$(uptime | sed 's/.*load average: //')\"}"
