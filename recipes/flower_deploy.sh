#!/usr/bin/env bash
# The fpsfl Flower app (pyproject.toml [tool.flwr.app]) across machines (Flower, Beutel et al. 2020), shown on
# one: a SuperLink, one SuperNode per client and `flwr run .`, all on 127.0.0.1 without TLS. The ServerApp
# runs federate's round loop and writes the run directory OUT; SuperNode i is client i (node config
# partition-id=i) and trains on its own data only: with SHARDS=DIR (federate export-partitions --out DIR, the
# same data and partition settings) it loads only DIR's shard i (node config data-dir) and the server checks
# its hash against DIR's manifest (run config shards); without, it draws its partition from the whole
# dataset (data-root=$DATA_ROOT when set).
# Usage: bash recipes/flower_deploy.sh OUT [run-config entries]   (the fpsfl venv active, pip install -e
#   ".[flower]"); the entries are the app's typed keys, e.g.
#   CLIENTS=2 bash recipes/flower_deploy.sh runs/flower-digits num-server-rounds=1 local-epochs=1 "algo='moon'"
# Federated self-pre-training (docs/self-pretraining.md): OUT a checkpoint, sp.ckpt (its run directory sp.run/
#   beside it), and the entry "self-pretrain='orchestra'".
# A failure drill: KILL=I:R:S kills SuperNode I (SIGKILL, its process group) when round R starts and starts it
#   again when round S starts; give the run "min-replies=0.8 flower-timeout=60" so the rounds go on without it.
# On real machines, the same commands with the SuperLink's address (and TLS certificates, not --insecure):
#   A:       flower-superlink --insecure --host 0.0.0.0 --port 9093 --disable-runtime-dependency-installation
#   client i: flower-supernode --insecure --superlink A:9093 --node-config "partition-id=i data-dir='/shards'"
#   anywhere: flwr run . <connection> --run-config "clients=N out='/abs/run' shards='/shards' ..."
#   (<connection>: [superlink.<connection>] address = "A:9093", insecure = true in $FLWR_HOME/config.toml)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUT [run-config entries]" >&2; exit 2; }
OUT=$(realpath -m "$1"); shift
CLIENTS=${CLIENTS:-2}
TIMEOUT=${TIMEOUT:-1800}  # s for the whole run
ROOT=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}  # logs, and FLWR_HOME: Flower's config and installed apps, kept out of ~/.flwr
export FLWR_HOME="$work/flwr"
mkdir -p "$FLWR_HOME"
pids=()  # the SuperLink and the drill; each SuperNode's process group id is in $work/supernode<i>.pid
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
    for file in "$work"/supernode*.pid; do [ -f "$file" ] && kill -- "-$(cat "$file")" 2> /dev/null || true; done
    wait 2> /dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
read -r -a ports <<< "$(python - "$((CLIENTS + 1))" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)"
link=127.0.0.1:${ports[0]}
printf '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "%s"\ninsecure = true\n' "$link" \
    > "$FLWR_HOME/config.toml"
flower-superlink --insecure --host 127.0.0.1 --port "${ports[0]}" --disable-runtime-dependency-installation \
    > "$work/superlink.log" 2>&1 &
pids+=($!)
python - "$link" <<'PY'  # wait for the SuperLink to listen
import socket, sys, time
host, port = sys.argv[1].split(":")
for _ in range(600):
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the SuperLink did not start")
PY
start_node() {  # SuperNode $1 in a process group of its own (its ClientApp processes too)
    local config="partition-id=$1"
    [ -z "${DATA_ROOT:-}" ] || config="$config data-root='$DATA_ROOT'"
    [ -z "${SHARDS:-}" ] || config="$config data-dir='$(realpath "$SHARDS")'"
    setsid flower-supernode --insecure --superlink "$link" --port "${ports[$(($1 + 1))]}" \
        --node-config "$config" >> "$work/supernode$1.log" 2>&1 &
    echo $! > "$work/supernode$1.pid"
}
for ((i = 0; i < CLIENTS; i++)); do start_node "$i"; done
done_file=$OUT/final.pt run_dir=$OUT  # self-pre-training: the checkpoint OUT, the run directory beside it
case $OUT in *.ckpt) done_file=$OUT run_dir=${OUT%.ckpt}.run ;; esac
rounds_done() { if [ -f "$run_dir/metrics.jsonl" ]; then wc -l < "$run_dir/metrics.jsonl"; else echo 0; fi; }
if [ -n "${KILL:-}" ]; then
    IFS=: read -r node kill_round start_round <<< "$KILL"
    (
        while [ "$(rounds_done)" -lt $((kill_round - 1)) ]; do sleep 0.1; done
        kill -9 -- "-$(cat "$work/supernode$node.pid")"
        echo "flower_deploy: killed SuperNode $node as round $kill_round started" >&2
        while [ "$(rounds_done)" -lt $((start_round - 1)) ]; do sleep 0.1; done
        start_node "$node"
        echo "flower_deploy: started SuperNode $node again as round $start_round started" >&2
    ) &
    pids+=($!)
fi
run_config="clients=$CLIENTS out='$OUT' $*"
[ -z "${SHARDS:-}" ] || run_config="$run_config shards='$(realpath "$SHARDS")'"
timeout "$TIMEOUT" flwr run "$ROOT" loopback --stream --run-config "$run_config" \
    > "$work/flwr-run.log" 2>&1 || true
if [ ! -f "$done_file" ]; then  # the ServerApp writes final.pt (or the checkpoint) after its last round
    tail -n 40 "$work"/*.log >&2
    echo "flower_deploy: the run did not finish (logs above)" >&2
    exit 1
fi
python - "$run_dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = {k: round(rows[-1][k], 4) for k in ("test_acc", "loss") if k in rows[-1]}  # federate's or SP's
print(json.dumps({"engine": "flower-deployment", "rounds": rows[-1]["round"],
                  **last, "seconds": round(sum(r["seconds"] for r in rows), 1),
                  "round_s": [round(r["seconds"], 2) for r in rows],
                  "missing_clients": {r["round"]: r["missing_clients"] for r in rows if r.get("missing_clients")}}))
PY
