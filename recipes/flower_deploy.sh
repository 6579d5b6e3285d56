#!/usr/bin/env bash
# The fpsfl Flower app (pyproject.toml [tool.flwr.app]) across machines (Flower, Beutel et al. 2020), shown on
# one: a SuperLink, one SuperNode per client and `flwr run .`, all on 127.0.0.1 without TLS. The ServerApp
# runs federate's round loop and writes the run directory OUT; SuperNode i is client i and trains on its own
# partition only (node config partition-id=i, data-root=$DATA_ROOT when set).
# Usage: bash recipes/flower_deploy.sh OUT [run-config entries]   (the fpsfl venv active, pip install -e
#   ".[flower]"); the entries are the app's typed keys, e.g.
#   CLIENTS=2 bash recipes/flower_deploy.sh runs/flower-digits num-server-rounds=1 local-epochs=1 "algo='moon'"
# On real machines, the same commands with the SuperLink's address (and TLS certificates, not --insecure):
#   A:       flower-superlink --insecure --host 0.0.0.0 --port 9093 --disable-runtime-dependency-installation
#   client i: flower-supernode --insecure --superlink A:9093 --node-config "partition-id=i data-root='/data'"
#   anywhere: flwr run . <connection> --run-config "clients=N out='/abs/run' ..."
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
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
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
for ((i = 0; i < CLIENTS; i++)); do
    config="partition-id=$i"
    [ -z "${DATA_ROOT:-}" ] || config="$config data-root='$DATA_ROOT'"
    flower-supernode --insecure --superlink "$link" --port "${ports[$((i + 1))]}" --node-config "$config" \
        > "$work/supernode$i.log" 2>&1 &
    pids+=($!)
done
timeout "$TIMEOUT" flwr run "$ROOT" loopback --stream --run-config "clients=$CLIENTS out='$OUT' $*" \
    > "$work/flwr-run.log" 2>&1 || true
if [ ! -f "$OUT/final.pt" ]; then  # the ServerApp writes final.pt after its last round
    tail -n 40 "$work"/*.log >&2
    echo "flower_deploy: the run did not finish (logs above)" >&2
    exit 1
fi
python - "$OUT/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(json.dumps({"engine": "flower-deployment", "rounds": rows[-1]["round"],
                  "test_acc": round(rows[-1]["test_acc"], 4), "seconds": round(sum(r["seconds"] for r in rows), 1)}))
PY
