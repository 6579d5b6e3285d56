#!/usr/bin/env bash
# The fpsfl Flower app (pyproject.toml [tool.flwr.app]) across machines (Flower, Beutel et al. 2020), shown on
# one: a SuperLink, one SuperNode per client and `flwr run .`, all on 127.0.0.1. By default the deployment is
# the one to run across real machines: TLS with certificates made here (python -m federated.flower.tls), and
# SuperNode authentication: the SuperLink runs with --enable-supernode-auth, node i's key is registered as
# fpsfl-client-i (flwr supernode register), and the ServerApp serves client i only through that node (run
# config node-names). The ServerApp runs federate's round loop and writes the run directory OUT. SuperNode i
# is client i (node config partition-id=i) and trains on its own data only: with SHARDS=DIR (federate
# export-partitions --out DIR, the same data and partition settings) it loads only DIR's shard i (node config
# data-dir) and the server checks its hash against DIR's manifest (run config shards); without, it draws its
# partition from the whole dataset (data-root=$DATA_ROOT when set). Each SuperNode runs with --isolation
# process beside an fpsfl executor (python -m federated.flower.executor 127.0.0.1:PORT) that takes its
# ClientApp tasks and runs them in one long-lived process, so torch, the shard and the model stay loaded and
# no flwr-clientapp process starts per message.
# Usage: bash recipes/flower_deploy.sh OUT [run-config entries]   (the fpsfl venv active, pip install -e
#   ".[flower]"); the entries are the app's typed keys, e.g.
#   CLIENTS=2 bash recipes/flower_deploy.sh runs/flower-digits num-server-rounds=1 local-epochs=1 "algo='moon'"
# Federated self-pre-training (docs/self-pretraining.md): OUT a checkpoint, sp.ckpt (its run directory sp.run/
#   beside it), and the entry "self-pretrain='orchestra'".
# Settings: SECURE=0 (no TLS, no authentication: the insecure loopback of flwr's quickstart), RUNNER=worker
#   (Flower starts a ClientApp process per message, which hands it to a warm python -m federated.flower.worker
#   over a Unix socket: node config worker) or RUNNER=cold (each message trains in its own cold ClientApp
#   process), WORK=DIR (keep the logs, certificates, keys and phase
#   log in DIR, which is left in place; by default a temporary folder, removed on exit), PHASES=1 (each
#   ClientApp and worker logs its cold-start phases to $WORK/phases.jsonl: federated/flower/phases.py).
# Failure drills: KILL=I:R:S kills SuperNode I (SIGKILL, its process group) when round R starts and starts it
#   again when round S starts; SLOW=I:R:S makes SuperNode I sleep S seconds before training round R (give
#   the run "min-replies=0.8 flower-timeout=60" so the rounds go on without it); INTRUDE=J:P (secure only)
#   starts two more SuperNodes that claim partition-id P: one with a key never registered (the SuperLink
#   refuses it) and one registered as client J's (the ServerApp leaves it out, in one line naming both).
# On real machines, the same commands with the SuperLink's address (A) in the certificate and the commands:
#   A:        python -m federated.flower.tls certs tls --host A; flower-superlink --ssl-ca-certfile tls/ca.pem
#             --ssl-certfile tls/server.pem --ssl-keyfile tls/server.key --enable-supernode-auth --host 0.0.0.0
#             --port 9093 --disable-runtime-dependency-installation
#   client i: python -m federated.flower.tls keys keys node-i (send node-i.pub to A's operator, who runs
#             flwr supernode register node-i.pub <connection> --name fpsfl-client-i); then
#             python -m federated.flower.executor 127.0.0.1:9094 & flower-supernode --root-certificates
#             ca.pem --superlink A:9093 --auth-supernode-private-key keys/node-i.key --isolation process
#             --port 9094 --node-config "partition-id=i data-dir='/shards'"
#   anywhere: flwr run . <connection> --run-config "clients=N out='/abs/run' shards='/shards'
#             node-names='fpsfl-client-{i}' ..."   (<connection>: [superlink.<connection>] address = "A:9093",
#             root-certificates = "/abs/ca.pem" in $FLWR_HOME/config.toml)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUT [run-config entries]" >&2; exit 2; }
OUT=$(realpath -m "$1"); shift
CLIENTS=${CLIENTS:-2}
TIMEOUT=${TIMEOUT:-1800}  # s for the whole run
SECURE=${SECURE:-1}
RUNNER=${RUNNER:-executor}
case $RUNNER in executor | worker | cold) ;; *) echo "$0: RUNNER=$RUNNER: executor, worker or cold" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${WORK:-}" ]; then  # the user's folder: left in place, with what this run wrote in it
    work=$(realpath -m "$WORK"); mkdir -p "$work"; made_work=0
else
    work=$(mktemp -d); made_work=1
fi
[ -z "${INTRUDE:-}" ] || [ "$SECURE" = 1 ] || { echo "$0: INTRUDE needs SECURE=1" >&2; exit 2; }
export FLWR_HOME="$work/flwr"  # Flower's config and installed apps, kept out of ~/.flwr
mkdir -p "$FLWR_HOME" "$work/logs"
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/fpsfl-deploy.XXXXXX")  # pid files, worker sockets: removed on exit
chmod 700 "$run_dir"  # the workers answer their own user only; the folder keeps the sockets private too
[ "${PHASES:-0}" = 0 ] || export FPSFL_CLIENT_PHASES="$work/phases.jsonl"
pids=()  # the SuperLink and the drills; each SuperNode's process group id is in $run_dir/node<i>.pid
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
    for file in "$run_dir"/node*.pid; do [ -f "$file" ] && kill -- "-$(cat "$file")" 2> /dev/null || true; done
    wait 2> /dev/null || true
    rm -rf "$run_dir"
    if [ "$made_work" = 1 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
read -r -a ports <<< "$(python - "$((CLIENTS + 3))" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)"
link=127.0.0.1:${ports[0]}
if [ "$SECURE" = 1 ]; then
    tls="$work/tls"  # this recipe's own throw-away deployment: a kept WORK gets new keys (--force)
    python -m federated.flower.tls certs "$tls" --host 127.0.0.1 --host localhost --force
    names=(); for ((i = 0; i < CLIENTS; i++)); do names+=("node-$i"); done
    [ -z "${INTRUDE:-}" ] || names+=(intruder stranger)
    python -m federated.flower.tls keys "$tls" "${names[@]}" --force
    link_flags=(--ssl-ca-certfile "$tls/ca.pem" --ssl-certfile "$tls/server.pem" --ssl-keyfile "$tls/server.key"
                --enable-supernode-auth)
    connection="root-certificates = \"$tls/ca.pem\""
else
    link_flags=(--insecure)
    connection="insecure = true"
fi
printf '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "%s"\n%s\n' "$link" "$connection" \
    > "$FLWR_HOME/config.toml"
flower-superlink "${link_flags[@]}" --host 127.0.0.1 --port "${ports[0]}" \
    --disable-runtime-dependency-installation > "$work/logs/superlink.log" 2>&1 &
pids+=($!)
python - "$link" "$!" <<'PY'  # wait for the SuperLink to listen (or to have exited)
import socket, sys, time
host, port = sys.argv[1].split(":")

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

for _ in range(600):
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        break
    except OSError:
        if not alive(sys.argv[2]):
            sys.exit("flower_deploy: the SuperLink exited (logs/superlink.log)")
        time.sleep(0.1)
else:
    sys.exit("flower_deploy: the SuperLink did not start listening (logs/superlink.log)")
PY
register() {  # register key $1 under the name $2 (a SuperLink with --enable-supernode-auth admits only these)
    local i
    for i in $(seq 1 50); do  # its Control API may still be starting
        flwr supernode register "$tls/$1.pub" loopback --name "$2" >> "$work/logs/register.log" 2>&1 && return
        sleep 0.2
    done
    echo "flower_deploy: could not register SuperNode key $1 (logs/register.log)" >&2; exit 1
}
if [ "$SECURE" = 1 ]; then
    for ((i = 0; i < CLIENTS; i++)); do register "node-$i" "fpsfl-client-$i"; done
fi
start_node() {  # SuperNode $1 (key $2, partition-id $3) and its executor or worker, in a process group of their own
    local node=$1 key=$2 pid=$3 port=$4
    local config="partition-id=$pid num-partitions=$CLIENTS"
    [ -z "${DATA_ROOT:-}" ] || config="$config data-root='$DATA_ROOT'"
    [ -z "${SHARDS:-}" ] || config="$config data-dir='$(realpath "$SHARDS")'"
    if [ -n "${SLOW:-}" ] && [ "${SLOW%%:*}" = "$node" ]; then config="$config drill-sleep='${SLOW#*:}'"; fi
    local flags=(--insecure)
    [ "$SECURE" = 0 ] || flags=(--root-certificates "$tls/ca.pem" --auth-supernode-private-key "$tls/$key.key")
    local helper=()  # the process beside the SuperNode that keeps torch, the shard and the model warm
    case $RUNNER in
        executor) helper=(python -m federated.flower.executor "127.0.0.1:$port"); flags+=(--isolation process) ;;
        worker) helper=(python -m federated.flower.worker "$run_dir/$node.sock"); config="$config worker='$run_dir/$node.sock'" ;;
    esac
    # $1: the helper's log, $2: its argument count, then the helper's and the SuperNode's arguments
    setsid bash -c 'log=$1 n=$2; shift 2; if [ "$n" -gt 0 ]; then "${@:1:$n}" >> "$log" 2>&1 & fi
                    shift "$n"; exec flower-supernode "$@"' _ "$work/logs/$RUNNER-$node.log" "${#helper[@]}" \
        "${helper[@]}" "${flags[@]}" --superlink "$link" --port "$port" --node-config "$config" \
        >> "$work/logs/supernode-$node.log" 2>&1 &
    echo $! > "$run_dir/node$node.pid"
}
for ((i = 0; i < CLIENTS; i++)); do start_node "$i" "node-$i" "$i" "${ports[$((i + 1))]}"; done
node_names=""
[ "$SECURE" = 0 ] || node_names="node-names='fpsfl-client-{i}'"
if [ -n "${INTRUDE:-}" ]; then  # a registered node with another client's partition-id, and an unregistered one
    IFS=: read -r as claims <<< "$INTRUDE"
    register intruder "fpsfl-client-$as"
    start_node intruder intruder "$claims" "${ports[$((CLIENTS + 1))]}"
    start_node stranger stranger "$claims" "${ports[$((CLIENTS + 2))]}"
fi
done_file=$OUT/final.pt out_dir=$OUT  # self-pre-training: the checkpoint OUT, the run directory beside it
case $OUT in *.ckpt) done_file=$OUT out_dir=${OUT%.ckpt}.run ;; esac
rounds_done() { if [ -f "$out_dir/metrics.jsonl" ]; then wc -l < "$out_dir/metrics.jsonl"; else echo 0; fi; }
if [ -n "${KILL:-}" ]; then
    IFS=: read -r node kill_round start_round <<< "$KILL"
    (
        while [ "$(rounds_done)" -lt $((kill_round - 1)) ]; do sleep 0.1; done
        kill -9 -- "-$(cat "$run_dir/node$node.pid")"
        echo "flower_deploy: killed SuperNode $node as round $kill_round started" >&2
        while [ "$(rounds_done)" -lt $((start_round - 1)) ]; do sleep 0.1; done
        start_node "$node" "node-$node" "$node" "${ports[$((node + 1))]}"
        echo "flower_deploy: started SuperNode $node again as round $start_round started" >&2
    ) &
    pids+=($!)
fi
run_config="clients=$CLIENTS out='$OUT' $node_names $*"
[ -z "${SHARDS:-}" ] || run_config="$run_config shards='$(realpath "$SHARDS")'"
timeout "$TIMEOUT" flwr run "$ROOT" loopback --stream --run-config "$run_config" \
    > "$work/logs/flwr-run.log" 2>&1 || true
if [ ! -f "$done_file" ]; then  # the ServerApp writes final.pt (or the checkpoint) after its last round
    tail -n 40 "$work"/logs/*.log >&2
    echo "flower_deploy: the run did not finish (logs above)" >&2
    exit 1
fi
python - "$out_dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = {k: round(rows[-1][k], 4) for k in ("test_acc", "loss") if k in rows[-1]}  # federate's or SP's
print(json.dumps({"engine": "flower-deployment", "rounds": rows[-1]["round"],
                  **last, "seconds": round(sum(r["seconds"] for r in rows), 1),
                  "round_s": [round(r["seconds"], 2) for r in rows],
                  "missing_clients": {r["round"]: r["missing_clients"] for r in rows if r.get("missing_clients")}}))
PY
