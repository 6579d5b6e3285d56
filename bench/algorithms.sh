#!/usr/bin/env bash
# Every algorithm on digits: 10 clients, Dir(0.3), 30 rounds, 1 local epoch, seeds 0 and 1 (issue 14).
# One JSON line per run: final and best test accuracy, whether any round had a non-finite loss (or the run
# stopped on one) and whether any round's global model had a negative BatchNorm running variance.
# Usage: bash bench/algorithms.sh [ALGO ...]     (default: every registered one; SEEDS="0 1" ROUNDS=30 override)
set -euo pipefail
algos=("$@")
if [ ${#algos[@]} -eq 0 ]; then
    # shellcheck disable=SC2207  # every registered algorithm (names without spaces)
    algos=($(python -c "from federated.algorithms import ALGORITHMS; print(*ALGORITHMS)"))
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for seed in ${SEEDS:-0 1}; do
  for algo in "${algos[@]}"; do
    start=$(date +%s.%N)
    status=0
    federate --dataset digits --partition dirichlet --alpha 0.3 --clients 10 --rounds "${ROUNDS:-30}" \
        --local-epochs 1 --algo "$algo" --seed "$seed" --no-eval-local --out "$tmp/$algo-$seed" --quiet \
        > /dev/null 2> "$tmp/err" || status=$?
    python - "$tmp/$algo-$seed/metrics.jsonl" "$algo" "$seed" "$status" "$start" "$(date +%s.%N)" \
        "$tmp/err" <<'PY'
import json, math, os, sys
path, algo, seed, status, t0, t1, err = sys.argv[1:]
rows = [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []
finite = all(math.isfinite(r[k]) for r in rows for k in ("test_loss", "train_loss"))
print(json.dumps({
    "algo": algo, "seed": int(seed), "rounds": len(rows),
    "final_test_acc": round(rows[-1]["test_acc"], 4) if rows else None,
    "best_test_acc": round(max(r["test_acc"] for r in rows), 4) if rows else None,
    "non_finite": not finite or status != "0",
    "negative_running_var": any(r.get("bn_min_var", 0.0) < 0 for r in rows),
    "min_running_var": min((r["bn_min_var"] for r in rows if "bn_min_var" in r), default=None),
    "exit": int(status), "error": open(err).read().strip()[-200:] if status != "0" else "",
    "wall_s": round(float(t1) - float(t0), 1)}))
PY
  done
done
