"""A Flower node's work on one message: train or evaluate, for one client (Beutel et al. 2020, Flower).

What travels (Flower's standard ``train`` message, so our ServerApp and Flower's own strategies,
``flwr.serverapp.strategy.FedAvg``/``FedProx``/``FedAvgM``, both drive it):

- in: ``arrays`` (the global model, an ArrayRecord) and ``config`` (``server-round``; ``lr``, else the
  run's schedule; ``client``, else the node's ``partition-id``; ``fpsfl-config``, federate's config as JSON,
  else the Flower run config, see :mod:`.run_config`; ``proximal-mu``, Flower's FedProx: the run trains
  FedProx with that mu; ``confirmed``, see below). Only what the algorithm's client reads comes on top:
  ``fpsfl.server`` (its ``client_reads`` server state, SCAFFOLD's c) and ``fpsfl.pools`` (the epoch's
  sample indices, only when they are not the client's whole partition every epoch, as FedVC draws them).
- out: ``arrays`` (the local model) and a MetricRecord ``metrics`` (``num-examples``, ``train-loss``,
  ``steps``, ``client``, ``keeps-state``), plus ``fpsfl.extra`` when the client step has a payload for the
  server (SCAFFOLD's delta c_i), and ``fpsfl.node`` (the shard's sha256) on a node with a shard. A node
  that cannot serve the message answers with a Flower ``Error`` (:data:`federated.flower.ERROR_CODES`).
- ``evaluate``: the global model tested on the client's own data (the node's shard), as a MetricRecord
  (``num-examples``, ``eval-loss``, ``eval-acc``): what a Flower strategy's evaluation round asks for.

**Client state, committed only when aggregated.** The client's persistent algorithm state (SCAFFOLD's c_i,
MOON's previous model, FedDyn's gradient, FedIR's weights, its BatchNorm statistics under --bn local)
lives only in the node's Flower ``Context``. A train step does not overwrite it: it *stages* the state it
produced under its round. The server's next message says, in ``confirmed``, the last round whose reply of
this client it aggregated; the node then commits that round's staged state (or keeps its committed one)
and discards every other staged state. So a reply the server never aggregated (it came after
--flower-timeout, or failed the server's checks) leaves no trace: the client goes on exactly as if it had
missed that round, and SCAFFOLD's c stays the mean of the c_i that were aggregated (Karimireddy et al.
2020, Alg. 1). A state the server confirms but the Context no longer holds (a new Flower run after
--resume, a restarted SuperNode) is a ``lost`` error, which the server names in one line. A server that
sends no ``confirmed`` (Flower's own strategies) gets the old behaviour: the state is committed at once.

The client trains with :func:`federated.rounds.make_job` and :func:`federated.rounds.train_client`, the
in-process engine's functions, on its own partition, built once per process (a warm :mod:`.worker` keeps
it across messages): with ``data-dir`` in the node config, the node's own shard of ``federate
export-partitions`` (:mod:`federated.shards`: only that file is read, never the test set); otherwise drawn
from the whole dataset as the server draws it (deterministic in the config's seed; ``data-root`` in the
node config says where the dataset lives).
"""

from __future__ import annotations

import json

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from fpsfl.base.device import resolve_device

from ..experiment import FederateConfig
from ..local import DivergenceError
from ..rounds import RoundPlan, frozen_copy, lr_at, make_job, precision, train_client
from ..setup import Setup, setup
from ..shards import Shard, ShardError, check_manifest, load_shard, partition_settings
from .phases import Phases
from .records import (
    EXTRA,
    drop_tree,
    get_tree,
    has_tree,
    is_packed,
    put_tree,
    read_state,
    state_record,
    tree_names,
)
from .refusal import Refused, error_reply
from .run_config import options_from_run_config

COMMITTED = "fpsfl.client"  # Context.state: {"round": r, "state": ...} of the last aggregated round
STAGED = "fpsfl.staged."  # + round: what that round's train step produced, until the server confirms it
_SETUP: dict[str, tuple[Setup, Shard | None]] = {}  # this process's Setup (one: the data load is slow)


def train(msg: Message, context: Context, phases: Phases | None = None) -> Message:
    """One round of local training, for the client the message names (default: this node's)."""
    phases = phases or Phases("inline")
    config = msg.content["config"]
    try:
        cfg, s, shard, client, device = _prepare(config, context, phases)
        rnd = int(config["server-round"])
        state = _client_state(context.state, config, client)
        result, loss = _train(cfg, s, msg, client, state, shard, device)
    except Refused as exc:
        return error_reply(msg, exc.kind, exc.reason)
    except DivergenceError as exc:
        return error_reply(msg, "diverged", str(exc))
    phases.mark("train")
    if state:  # staged until the server confirms it aggregated this reply (committed at once for others)
        name = f"{STAGED}{rnd}" if "confirmed" in config else COMMITTED
        put_tree(context.state, name, {"round": rnd, "state": state})
    reply = RecordDict({"arrays": state_record(result.state, packed=is_packed(msg.content["arrays"])),
                        "metrics": MetricRecord({"num-examples": result.n_samples, "train-loss": loss,
                                                 "steps": result.steps, "client": client,
                                                 "keeps-state": int(bool(state))})})
    if result.extra:
        put_tree(reply, EXTRA, result.extra)
    if shard is not None:  # which data it trained on: the server checks it against its manifest
        reply["fpsfl.node"] = ConfigRecord({"shard-sha256": shard.sha256})
    phases.mark("reply")
    return Message(reply, reply_to=msg)


def self_pretrain(msg: Message, context: Context, phases: Phases | None = None) -> Message:
    """One round of federated self-pre-training (:mod:`.selfsup_node`: a stateless client)."""
    from .selfsup_node import train as train_self_pretrain

    return train_self_pretrain(msg, context, phases)


def evaluate(msg: Message, context: Context, phases: Phases | None = None) -> Message:
    """The global model tested on the client's own data (a Flower strategy's evaluation round)."""
    phases = phases or Phases("inline")
    config = msg.content["config"] if "config" in msg.content else ConfigRecord()
    try:
        _, s, _, client, device = _prepare(config, context, phases)
    except Refused as exc:
        return error_reply(msg, exc.kind, exc.reason)
    s.model.load_state_dict(read_state(msg.content["arrays"], device))
    part = s.parts[client].to(s.data.train_x.device)
    with precision(s), torch.no_grad():
        metrics = s.task.evaluate(s.model, s.data.train_x[part], s.data.train_y[part])
    phases.mark("evaluate")
    scalars = {f"eval-{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    metrics = MetricRecord({"num-examples": len(part), **scalars})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def _prepare(config: ConfigRecord, context: Context,
             phases: Phases) -> tuple[FederateConfig, Setup, Shard | None, int, torch.device]:
    """The run's config, its Setup in this process, the node's shard, the client the message is for, and
    the device."""
    try:
        cfg = _config(config, context)
    except ValueError as exc:
        raise Refused("config", str(exc)) from None
    node_config = context.node_config
    client = int(config.get("client", node_config.get("partition-id", -1)))
    partitions = node_config.get("num-partitions")
    if partitions is not None and int(partitions) != cfg.clients:
        raise Refused("config", f"the run has clients={cfg.clients}, this node's federation "
                                f"num-partitions={int(partitions)}")
    device = resolve_device(str(node_config.get("device", config.get("device", "auto"))))
    try:
        s, shard = _setup(cfg, node_config, client, device, phases)
    except ShardError as exc:
        raise Refused("config", str(exc)) from None
    if not 0 <= client < len(s.parts):
        raise Refused("config", f"this node serves client {client}, which a {len(s.parts)}-client partition "
                                f"does not have (node config partition-id)")
    return cfg, s, shard, client, device


def _config(config: ConfigRecord, context: Context) -> FederateConfig:
    """federate's config: the message's (our ServerApp sends it), else the Flower run config's; Flower's
    FedProx strategy's ``proximal-mu`` makes it FedProx with that mu (Li et al. 2020)."""
    if "fpsfl-config" in config:
        cfg = FederateConfig.from_dict(json.loads(str(config["fpsfl-config"])))
    else:
        cfg = options_from_run_config(dict(context.run_config))[0]
    if "proximal-mu" not in config:
        return cfg
    if cfg.algo not in ("fedavg", "fedprox"):
        raise ValueError(f"the server sent proximal-mu (FedProx), but this run's algo is {cfg.algo}")
    values = cfg.to_dict()
    values.update(algo="fedprox", algo_args={**cfg.algo_args, "mu": float(config["proximal-mu"])})
    return FederateConfig.from_dict(values)


def _setup(cfg: FederateConfig, node_config: dict, client: int, device: torch.device,
           phases: Phases) -> tuple[Setup, Shard | None]:
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
            phases.mark("shard")
        _SETUP[key] = (setup(cfg, device, load_init=False, shard=shard), shard)  # weights: per message
        phases.mark("model")
    return _SETUP[key]


def _client_state(records: RecordDict, config: ConfigRecord, client: int) -> dict:
    """The client state to train from, after committing the staged state of the round the server confirms
    (``confirmed``: the last round whose reply of this client it aggregated; 0: none) and discarding the
    others. Without ``confirmed`` (a server that does not confirm), the committed state as it is."""
    held = get_tree(records, COMMITTED) if has_tree(records, COMMITTED) else {"round": 0, "state": {}}
    if "confirmed" not in config:
        return held["state"]
    confirmed = int(config["confirmed"])
    if confirmed != held["round"]:
        if confirmed == 0:
            held = {"round": 0, "state": {}}
        elif has_tree(records, f"{STAGED}{confirmed}"):
            held = get_tree(records, f"{STAGED}{confirmed}")
        else:
            raise Refused("lost", f"client {client}")
        drop_tree(records, COMMITTED)
        if held["state"]:
            put_tree(records, COMMITTED, held)
    for name in tree_names(records, STAGED):  # replies the server did not aggregate: as if never trained
        drop_tree(records, name)
    return held["state"]


def _train(cfg: FederateConfig, s: Setup, msg: Message, client: int, state: dict, shard: Shard | None,
           device: torch.device):
    """The client's local training and client step from the message's global model; (result, loss)."""
    config = msg.content["config"]
    has_server = has_tree(msg.content, "fpsfl.server")
    s.algo.server = get_tree(msg.content, "fpsfl.server", device) if has_server else {}
    rnd = int(config["server-round"]) - 1
    if has_tree(msg.content, "fpsfl.pools"):
        pools = get_tree(msg.content, "fpsfl.pools")
        pools = [pools[str(epoch)] for epoch in range(len(pools))]
        if shard is not None:  # the server draws pools in the full training set's positions
            try:
                pools = [shard.to_local(pool) for pool in pools]
            except ShardError as exc:
                raise Refused("config", str(exc)) from None
    else:  # FedAvg's default: the client's whole partition every local epoch
        pools = [s.parts[client]] * cfg.local_epochs
    global_state = read_state(msg.content["arrays"], device)
    s.model.load_state_dict(global_state)
    lr = float(config["lr"]) if "lr" in config else lr_at(cfg, rnd)
    plan = RoundPlan(rnd, lr, [client], [pools], global_state, frozen_copy(s.model), {})
    return train_client(s, cfg, make_job(cfg, plan, 0, state, device))
