#!/usr/bin/env bash
# What --engine flower (Flower's simulation engine, Ray) costs over the in-process engine: digits, 10 clients,
# Dir(0.3), 10 rounds, 1 local epoch, FedAvg, seed 0, no local evaluation. One JSON line per engine (wall
# seconds, its first round, the mean of the later rounds), then one with Flower's overhead: start-up (Ray,
# one ClientApp actor per client slot, each loading the data) and per round (messages), and whether both
# engines gave the same test accuracies (they should: the same code trains and aggregates).
# Usage: bash bench/flower.sh [ROUNDS]   (needs pip install -e ".[flower]"; DEVICE=cuda and
#   FLOWER_RESOURCES=num_cpus=1,num_gpus=0.1 to put the Flower clients on the GPU too)
set -euo pipefail
rounds=${1:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for engine in inprocess flower; do
    start=$(date +%s.%N)
    federate --dataset digits --partition dirichlet --alpha 0.3 --clients 10 --rounds "$rounds" \
        --local-epochs 1 --algo fedavg --seed 0 --no-eval-local --device "${DEVICE:-cpu}" --engine "$engine" \
        --flower-resources "${FLOWER_RESOURCES:-num_cpus=1,num_gpus=0}" --out "$tmp/$engine" --quiet \
        > /dev/null 2> "$tmp/$engine.err" || { cat "$tmp/$engine.err" >&2; exit 1; }
    echo "$start $(date +%s.%N)" > "$tmp/$engine.wall"
done
python - "$tmp" <<'PY'
import json, sys
from pathlib import Path
tmp, out = Path(sys.argv[1]), {}
for engine in ("inprocess", "flower"):
    rows = [json.loads(line) for line in (tmp / engine / "metrics.jsonl").read_text().splitlines()]
    start, end = map(float, (tmp / f"{engine}.wall").read_text().split())
    later = [r["seconds"] for r in rows[1:]] or [float("nan")]
    out[engine] = {"engine": engine, "rounds": len(rows), "wall_s": round(end - start, 1),
                   "first_round_s": round(rows[0]["seconds"], 2), "round_s": round(sum(later) / len(later), 3),
                   "test_accs": [r["test_acc"] for r in rows]}
    print(json.dumps({k: v for k, v in out[engine].items() if k != "test_accs"}))
a, b = out["inprocess"], out["flower"]
print(json.dumps({"flower_overhead_wall_s": round(b["wall_s"] - a["wall_s"], 1),
                  "flower_overhead_startup_s": round(b["first_round_s"] - a["first_round_s"], 2),
                  "flower_overhead_per_round_s": round(b["round_s"] - a["round_s"], 3),
                  "same_test_accs": a["test_accs"] == b["test_accs"]}))
PY
