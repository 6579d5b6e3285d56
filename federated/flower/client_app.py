"""The Flower ClientApp: one client's local training, evaluation and identity (Beutel et al. 2020, Flower).

What its messages carry, and how a client's state is staged until the server aggregates it, is
:mod:`.node`'s docstring. This module is what each of Flower's per-message ``flwr-clientapp`` processes
imports, so it imports only Flower and the standard library: with ``worker='SOCKET'`` in the node config it
hands the message to the node's warm :mod:`.worker` (torch, the shard and the model already loaded there);
otherwise, or when no worker answers, it imports :mod:`.node` and does the work itself. A SuperNode with
the fpsfl :mod:`.executor` (``--isolation process``) runs it in that one long-lived process instead. With
``FPSFL_CLIENT_PHASES=FILE`` in the SuperNode's environment, each process logs its cold-start phases
(:mod:`.phases`).

A failure drill (recipes/flower_deploy.sh ``SLOW=I:R:S``): with ``drill-sleep='R:S'`` in its node config, the
node sleeps S seconds before it trains round R, as a node that falls behind (past ``--flower-timeout``,
it answers late, and its reply must leave no trace: see :mod:`.node`).
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .phases import Phases

PHASES = Phases("clientapp", since_start=True)  # this process's start-up, up to this module
app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Which client this node says it serves, and how many partitions its federation has (Flower's
    simulation sets ``num-partitions``; a deployment may)."""
    node = context.node_config
    facts = {"partition-id": int(node.get("partition-id", -1)),
             "num-partitions": int(node.get("num-partitions", 0))}
    return Message(RecordDict({"node": ConfigRecord(facts)}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training (:func:`.node.train`)."""
    return _handle("train", msg, context)


@app.train("selfpretrain")
def self_pretrain(msg: Message, context: Context) -> Message:
    """One round of federated self-pre-training (``train.selfpretrain`` messages, :mod:`.selfsup_node`)."""
    return _handle("self_pretrain", msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The global model on the client's own data (:func:`.node.evaluate`)."""
    return _handle("evaluate", msg, context)


def _handle(kind: str, msg: Message, context: Context) -> Message:
    global PHASES
    phases, cold = PHASES, PHASES.cold
    _drill(kind, msg, context)
    worker = str(context.node_config.get("worker") or "")
    reply = None
    if worker:
        from .worker import forward

        reply = forward(worker, kind, msg, context)
        phases.mark("forward")
    if reply is None:
        from . import node  # torch and the run's code: only in a process that trains itself

        phases.mark("imports")
        reply = getattr(node, kind)(msg, context, phases)
    config = msg.content["config"] if "config" in msg.content else {}
    phases.write(kind=kind, cold=cold, client=config.get("client", context.node_config.get("partition-id")),
                 round=config.get("server-round"))
    PHASES = Phases("clientapp")  # a process that serves more messages (the simulation's actors): warm
    return reply


def _drill(kind: str, msg: Message, context: Context) -> None:
    """Sleep as the node config's ``drill-sleep='ROUND:SECONDS'`` says, before training that round."""
    spec = str(context.node_config.get("drill-sleep") or "")
    if kind == "train" and spec:
        rnd, seconds = spec.split(":")
        if int(msg.content["config"]["server-round"]) == int(rnd):
            time.sleep(float(seconds))
