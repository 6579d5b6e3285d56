"""The Flower ClientApp: one client's local training and client step (Beutel et al. 2020, Flower).

It answers Flower's standard ``train`` message, so it runs under our ServerApp and under Flower's own
strategies (``flwr.serverapp.strategy.FedAvg``/``FedProx``/``FedAvgM``) alike:

- in: ``arrays`` (the global model, an ArrayRecord) and ``config`` (``server-round``; ``lr``, else the
  run's schedule; ``client``, else the node's ``partition-id``; ``fpsfl-config``, federate's config as JSON,
  else the Flower run config, see :mod:`.run_config`). Only what the algorithm's client reads comes on top:
  ``fpsfl.server`` (its ``client_reads`` server state, SCAFFOLD's c) and ``fpsfl.pools`` (the epoch's
  sample indices, only when they are not the client's whole partition every epoch, as FedVC draws them).
- out: ``arrays`` (the local model) and a MetricRecord ``metrics`` (``num-examples``, the FedAvg weight;
  ``train-loss``, ``steps``, ``client``, ``keeps-state``), plus ``fpsfl.extra`` when the client step has a
  payload for the server (SCAFFOLD's delta c_i).

The client's persistent algorithm state (SCAFFOLD's c_i, MOON's previous model, FedDyn's gradient, FedIR's
weights, its BatchNorm statistics under --bn local) lives only in the node's Flower ``Context``: it never
travels. A Context starts empty in each Flower run, so when the server says the client should hold state
(``expect-state``: it said ``keeps-state`` before, recorded in state.pt) and the Context has none, the
reply says the state is lost; the server names every such client in one line.

The client trains with :func:`federated.rounds.make_job` and :func:`federated.rounds.train_client`, the
in-process engine's functions, on its own partition, built once per process: with ``data-dir`` in the node
config, the node's own shard of ``federate export-partitions`` (:mod:`federated.shards`: only that file is
read, never the test set; the reply carries its sha256 in ``fpsfl.node``, which the server checks);
otherwise drawn from the whole dataset as the server draws it (deterministic in the config's seed;
``data-root`` in the node config says where the dataset lives).
"""

from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fpsfl.base.device import resolve_device

from ..experiment import FederateConfig
from ..local import DivergenceError
from ..rounds import RoundPlan, frozen_copy, lr_at, make_job, train_client
from ..setup import Setup, setup
from ..shards import Shard, ShardError, check_manifest, load_shard, partition_settings
from .records import get_tree, has_tree, put_tree
from .run_config import options_from_run_config

app = ClientApp()
STATE = "fpsfl.client"  # the Context.state records holding this client's algorithm state
_SETUP: dict[str, Setup] = {}  # this process's Setup, built on the first train message (data load: slow)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Which client this node is."""
    pid = context.node_config.get("partition-id")
    return Message(RecordDict({"node": ConfigRecord({"partition-id": -1 if pid is None else int(pid)})}),
                   reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training, for the client the message names (default: this node's)."""
    config = msg.content["config"]
    cfg = _config(config, context)
    client = int(config.get("client", context.node_config.get("partition-id", -1)))
    device = resolve_device(str(context.node_config.get("device", config.get("device", "auto"))))
    try:
        s, shard = _setup(cfg, context.node_config, client, device)
    except ShardError as exc:
        return _fail(msg, "config", str(exc))
    if not 0 <= client < len(s.parts):
        return _fail(msg, "config", f"this node serves client {client}, which a {len(s.parts)}-client "
                                    f"partition does not have (node config partition-id)")
    if has_tree(context.state, STATE):
        state = get_tree(context.state, STATE, device)
    elif config.get("expect-state", False):
        return _fail(msg, "lost", f"client {client}")
    else:
        state = {}
    has_server = has_tree(msg.content, "fpsfl.server")
    s.algo.server = get_tree(msg.content, "fpsfl.server", device) if has_server else {}
    rnd = int(config["server-round"]) - 1
    if has_tree(msg.content, "fpsfl.pools"):
        pools = get_tree(msg.content, "fpsfl.pools")
        pools = [pools[str(epoch)] for epoch in range(len(pools))]
        if shard is not None:  # the server draws pools in the full training set's positions
            pools = [shard.to_local(pool) for pool in pools]
    else:  # FedAvg's default: the client's whole partition every local epoch
        pools = [s.parts[client]] * cfg.local_epochs
    global_state = {k: v.to(device) for k, v in msg.content["arrays"].to_torch_state_dict().items()}
    s.model.load_state_dict(global_state)
    lr = float(config["lr"]) if "lr" in config else lr_at(cfg, rnd)
    plan = RoundPlan(rnd, lr, [client], [pools], global_state, frozen_copy(s.model), {})
    try:
        result, loss = train_client(s, cfg, make_job(cfg, plan, 0, state, device))
    except DivergenceError as exc:
        return _fail(msg, "diverged", str(exc))
    if state:
        put_tree(context.state, STATE, state)
    reply = RecordDict({"arrays": ArrayRecord({k: v.cpu() for k, v in result.state.items()}),
                        "metrics": MetricRecord({"num-examples": result.n_samples, "train-loss": loss,
                                                 "steps": result.steps, "client": client,
                                                 "keeps-state": int(bool(state))})})
    if result.extra:
        put_tree(reply, "fpsfl.extra", result.extra)
    if shard is not None:  # which data it trained on: the server checks it against its manifest
        reply["fpsfl.node"] = ConfigRecord({"shard-sha256": shard.sha256})
    return Message(reply, reply_to=msg)


def _config(config: ConfigRecord, context: Context) -> FederateConfig:
    """federate's config: the message's (our ServerApp sends it), else the Flower run config's."""
    if "fpsfl-config" in config:
        return FederateConfig.from_dict(json.loads(str(config["fpsfl-config"])))
    return options_from_run_config(dict(context.run_config))[0]


def _setup(cfg: FederateConfig, node_config: dict, client: int,
           device: torch.device) -> tuple[Setup, Shard | None]:
    """The run's data, partition, task, model and algorithm in this process (built once per config), and
    the node's shard when its node config names a ``data-dir`` (then only that shard is loaded)."""
    values = cfg.to_dict()
    if node_config.get("data-root"):
        values["data_root"] = str(node_config["data-root"])
    data_dir = str(node_config.get("data-dir") or "")
    key = json.dumps([values, str(device), data_dir, client if data_dir else None], sort_keys=True,
                     default=str)
    if key not in _SETUP:
        _SETUP.clear()
        cfg = FederateConfig.from_dict(values)
        shard = None
        if data_dir:
            shard = load_shard(data_dir, client)
            check_manifest(shard.manifest, partition_settings(cfg), data_dir)
        _SETUP[key] = (setup(cfg, device, load_init=False, shard=shard), shard)  # weights: per message
    return _SETUP[key]


def _fail(msg: Message, kind: str, reason: str) -> Message:
    """A reply the server turns into an exception (divergence: the run's one-line error, exit code 1)."""
    return Message(RecordDict({"fpsfl.failed": ConfigRecord({"kind": kind, "reason": reason})}), reply_to=msg)
