"""The Flower ClientApp: one client's local training and client step (Beutel et al. 2020, Flower).

Two message types. ``query``: the node says which client it is, its ``partition-id`` node config (set by
Flower's simulation engine, and by ``flower-supernode --node-config "partition-id=3 data-root=..."`` in a
deployment). ``train``: one round's job for this client (the run's config, the round, its learning rate,
its per-epoch sample pools, the global model, the algorithm's server state); the client builds the
:class:`federated.batched.ClientJob` with :func:`federated.rounds.make_job`, trains and finishes it with
:func:`federated.rounds.train_client`, the functions of the in-process engine, and replies with its
:class:`federated.algorithms.ClientResult` and mean loss.

The client's persistent algorithm state (``algo.clients[i]``: SCAFFOLD's c_i, MOON's previous model, ...)
lives in the Flower ``Context`` (``context.state``) from round to round. A ServerApp run's first message to
a client carries the state the server holds for it (empty at the start of a run; after ``--resume``, the
one saved in ``state.pt``) and replaces the Context's, so a restarted ServerApp, whose clients' Contexts
start empty, continues exactly. Every reply carries the updated state back: the server keeps a copy to save
with each round's checkpoint (see :mod:`.server_app`).

The client loads the run's dataset and partition itself (deterministic in the config's seed; ``data-root``
in the node config overrides where it lives) and trains on its own partition's samples only.
"""

from __future__ import annotations

import json

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fpsfl.base.device import resolve_device

from ..experiment import FederateConfig
from ..local import DivergenceError
from ..rounds import RoundPlan, frozen_copy, make_job, train_client
from ..setup import Setup, setup
from .records import get_state, get_tree, has_tree, put_state, put_tree

app = ClientApp()
STATE = "fpsfl.client"  # the Context.state records holding algo.clients[i]
_SETUP: dict[str, Setup] = {}  # this process's Setup, built on the first train message (data load: slow)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Which client this node is."""
    pid = context.node_config.get("partition-id")
    return Message(RecordDict({"node": ConfigRecord({"partition-id": -1 if pid is None else int(pid)})}),
                   reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training for the client the message names."""
    job = msg.content["job"]
    device = resolve_device(str(context.node_config.get("device", job["device"])))
    s = _setup(str(job["config"]), context.node_config.get("data-root"), device)
    cfg, client = FederateConfig.from_dict(json.loads(str(job["config"]))), int(job["client"])
    if job["seed"]:
        state = get_tree(msg.content, "client", device)
    elif has_tree(context.state, STATE):
        state = get_tree(context.state, STATE, device)
    else:  # the server seeds a client once per ServerApp run: an empty Context now means a lost state
        return _fail(msg, "lost", f"client {client}: its state is gone from the Flower Context (did its "
                                  f"SuperNode restart?); restart the ServerApp with --resume")
    s.algo.server = get_tree(msg.content, "server", device)
    sent = set(s.algo.server)
    pools = get_tree(msg.content, "pools")
    pools = [pools[str(epoch)] for epoch in range(len(pools))]
    global_state = get_state(msg.content, "global", device)
    s.model.load_state_dict(global_state)
    plan = RoundPlan(int(job["rnd"]), float(job["lr"]), [client], [pools], global_state,
                     frozen_copy(s.model), {})
    try:
        result, loss = train_client(s, cfg, make_job(cfg, plan, 0, state, device))
    except DivergenceError as exc:
        return _fail(msg, "diverged", str(exc))
    put_tree(context.state, STATE, state)
    reply = RecordDict({"result": ConfigRecord({"n_samples": result.n_samples, "steps": result.steps,
                                                "loss": loss})})
    put_state(reply, "state", result.state)
    put_tree(reply, "extra", result.extra)
    put_tree(reply, "client", state)
    # server state a client hook made on first use (SCAFFOLD's c = 0): in one process the client's and the
    # server's algorithm are one object, so the server's must get it too
    put_tree(reply, "server_new", {k: v for k, v in s.algo.server.items() if k not in sent})
    return Message(reply, reply_to=msg)


def _setup(config: str, data_root: object, device: torch.device) -> Setup:
    """The run's data, partition, task, model and algorithm in this process (built once per config)."""
    key = json.dumps([config, data_root, str(device)])
    if key not in _SETUP:
        values = json.loads(config)
        if data_root:
            values["data_root"] = str(data_root)
        _SETUP.clear()
        _SETUP[key] = setup(FederateConfig.from_dict(values), device, load_init=False)  # weights: per message
    return _SETUP[key]


def _fail(msg: Message, kind: str, reason: str) -> Message:
    """A reply the server turns into an exception (divergence: the run's one-line error, exit code 1)."""
    return Message(RecordDict({"failed": ConfigRecord({"kind": kind, "reason": reason})}), reply_to=msg)
