#!/usr/bin/env bash
# The issue's digits figure for every algorithm: 10 clients, Dir(0.3), 20 rounds, 1 local epoch, seed 0.
# One JSON line per algorithm: final and best test accuracy, mean local accuracy and wall seconds.
# Usage: bash bench/federate_digits.sh [ALGO ...]    (default: all nine)
set -euo pipefail
algos=("$@")
if [ ${#algos[@]} -eq 0 ]; then
    algos=(fedavg fedprox feddyn moon scaffold fednova fedavgm fedvc fedir)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for algo in "${algos[@]}"; do
    start=$(date +%s.%N)
    federate --dataset digits --partition dirichlet --alpha 0.3 --clients 10 --rounds 20 --local-epochs 1 \
        --algo "$algo" --out "$tmp/$algo" --quiet > /dev/null
    python - "$tmp/$algo/metrics.jsonl" "$algo" "$start" "$(date +%s.%N)" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(json.dumps({"algo": sys.argv[2], "final_test_acc": round(rows[-1]["test_acc"], 4),
                  "best_test_acc": round(max(r["test_acc"] for r in rows), 4),
                  "final_local_acc": round(rows[-1].get("local_acc", float("nan")), 4),
                  "wall_s": round(float(sys.argv[4]) - float(sys.argv[3]), 1)}))
PY
done
