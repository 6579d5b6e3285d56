#!/usr/bin/env bash
# What Flower costs over the in-process engine, and what a lost SuperNode does (Beutel et al. 2020; issue 25).
# digits, 10 clients, Dir(0.3), 10 rounds, 1 local epoch, FedAvg, seed 0, no local evaluation, CPU:
#   1. in-process engine;  2. --engine flower (Flower's simulation runtime, Ray);
#   3. a loopback deployment (recipes/flower_deploy.sh): a SuperLink and 10 SuperNodes, each on its own shard
#      of `federate export-partitions`;
#   4. the same deployment with SuperNode 3 killed (SIGKILL) as round 3 starts and restarted as round 5 starts,
#      --min-replies 0.8 --flower-timeout 60.
# One JSON line each (wall seconds, first round, mean of the later rounds, the rounds' clients that were
# missing), then one comparing 1 and 2 (Flower's start-up and per-round overhead; whether both gave the same
# test accuracies: they should, the same code trains and aggregates), then bench/flower_bytes.py's bytes per
# round per algorithm (SCAFFOLD, MOON, FedAvg).
# Usage: bash bench/flower.sh [ROUNDS]   (needs pip install -e ".[flower]"; DEPLOY=0 skips 3 and 4; DEVICE=cuda
#   and FLOWER_RESOURCES=num_cpus=1,num_gpus=0.1 put the simulated clients on the GPU)
set -euo pipefail
rounds=${1:-10}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
    config=(alpha=0.3 seed=0 "num-server-rounds=$rounds" local-epochs=1 "algo='fedavg'" eval-local=false
            "device='cpu'")
    for run in deployment drill; do
        extra=(); drill=()
        [ "$run" = drill ] && { extra=(min-replies=0.8 flower-timeout=60); drill=(KILL=3:3:5); }
        start=$(date +%s.%N)
        env CLIENTS=10 SHARDS="$tmp/shards" OMP_NUM_THREADS=1 "${drill[@]}" bash "$here/../recipes/flower_deploy.sh" \
            "$tmp/$run" "${config[@]}" "${extra[@]}" > /dev/null 2> "$tmp/$run.err" || { cat "$tmp/$run.err" >&2; exit 1; }
        echo "$start $(date +%s.%N)" > "$tmp/$run.wall"
        runs+=("$run")
    done
fi
python - "$tmp" "${runs[@]}" <<'PY'
import json, sys
from pathlib import Path
tmp, out = Path(sys.argv[1]), {}
for run in sys.argv[2:]:
    rows = [json.loads(line) for line in (tmp / run / "metrics.jsonl").read_text().splitlines()]
    start, end = map(float, (tmp / f"{run}.wall").read_text().split())
    later = [r["seconds"] for r in rows[1:]] or [float("nan")]
    out[run] = {"run": run, "rounds": len(rows), "wall_s": round(end - start, 1),
                "first_round_s": round(rows[0]["seconds"], 2), "round_s": round(sum(later) / len(later), 3),
                "rounds_s": [round(r["seconds"], 1) for r in rows],
                "missing_clients": {r["round"]: r["missing_clients"] for r in rows if r.get("missing_clients")},
                "final_test_acc": round(rows[-1]["test_acc"], 4), "test_accs": [r["test_acc"] for r in rows]}
    print(json.dumps({k: v for k, v in out[run].items() if k != "test_accs"}))
a, b = out["inprocess"], out["flower"]
print(json.dumps({"flower_overhead_wall_s": round(b["wall_s"] - a["wall_s"], 1),
                  "flower_overhead_startup_s": round(b["first_round_s"] - a["first_round_s"], 2),
                  "flower_overhead_per_round_s": round(b["round_s"] - a["round_s"], 3),
                  "same_test_accs": a["test_accs"] == b["test_accs"],
                  "deployment_same_test_accs": out.get("deployment", {}).get("test_accs") == b["test_accs"]}))
PY
python "$here/flower_bytes.py" scaffold moon fedavg
