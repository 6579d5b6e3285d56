#!/usr/bin/env bash
# The paper's measure of pre-training (Chen et al., ICLR 2023, Table 6: FedAvg from FPS vs random init) on
# natural images at CPU scale: the CIFAR-10 probe set (../shared/data/cifar10-probe, 2,543 training and 509
# test images) as an image folder, ResNet20 at 32 px, Table 6's clients (10, Dir(0.1) as the paper splits it,
# full participation) and local optimiser (SGD lr 0.01, batch 32), ROUNDS rounds of LOCAL_EPOCHS (default
# 40 x 1, where the paper runs 100 x 5; lr x0.1 every 30 rounds, federate's default, App. B.1), from random
# init and from the shipped FPS weights, one seed after another per init, the two inits side by side.
# Prints one JSON line per init: final-round and last-3-round test accuracy (%), per seed and mean ± std.
# Usage: bash bench/fps_fedavg.sh OUT [SEEDS]   (DATA, ROUNDS, LOCAL_EPOCHS, FPS=weights name, DEVICE)
set -euo pipefail
out=${1:?usage: bash bench/fps_fedavg.sh OUT [SEEDS]}
seeds=${2:-0 1 2}
data=${DATA:-$(dirname "$0")/../../shared/data/cifar10-probe}
fps=${FPS:-fps-mocov2-t05-resnet20-cpu-1m}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # two single-thread runs share the 2-core VM
arm() {  # arm INIT TAG: every seed, continued with --resume where a run started (checked against its record)
    for s in $seeds; do
        local dir="$out/fl-$2-s$s" resume=()
        [ -f "$dir/config.json" ] && resume=(--resume)
        federate --dataset imagefolder --data-root "$data" --arch resnet20 --input-size 32 --alpha 0.1 \
            --balance none --clients 10 --rounds "${ROUNDS:-40}" --local-epochs "${LOCAL_EPOCHS:-1}" --lr 0.01 \
            --batch-size 32 --no-eval-local --init "$1" --seed "$s" --device "${DEVICE:-cpu}" --quiet \
            --out "$dir" "${resume[@]}" > "$dir.log" 2>&1
    done
}
mkdir -p "$out"
arm random random & arm "$fps" fps & wait
python - "$out" $seeds <<'PY'
import json, statistics, sys
from pathlib import Path
out, seeds = Path(sys.argv[1]), sys.argv[2:]
for tag in ("random", "fps"):
    last, tail = [], []
    for s in seeds:
        rows = [json.loads(x) for x in (out / f"fl-{tag}-s{s}" / "metrics.jsonl").read_text().splitlines()]
        last.append(100 * rows[-1]["test_acc"])
        tail.append(100 * sum(r["test_acc"] for r in rows[-3:]) / 3)
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    print(json.dumps({"init": tag, "rounds": rows[-1]["round"], "final": [round(v, 1) for v in last],
                      "final_mean": round(statistics.mean(last), 1), "final_std": round(sd(last), 1),
                      "last3_mean": round(statistics.mean(tail), 1), "last3_std": round(sd(tail), 1)}))
PY
