"""A Grid stand-in whose nodes run our ClientApp in this process, for fast Flower tests (no SuperLink, no
Ray): rounds with nodes that are offline, hung, slow (a reply that comes after its round closed) or that
answer with a tampered reply, and the server's dispatcher run over it. The same over real SuperNode
processes is test_flower_deploy.py, over Flower's simulation runtime test_flower.py (slow)."""

from __future__ import annotations

import json
import time

import pytest

from federated import runner
from federated.experiment import FederateConfig, RunOptions

ACTIONS = {"train.selfpretrain": "self_pretrain"}  # message type -> the ClientApp's function
TINY = dict(dataset="digits", clients=3, rounds=2, local_epochs=1, batch_size=32, width=0.25, alpha=1.0,
            seed=0, eval_local=False)


def flower_identity(monkeypatch) -> None:
    """Flower, and the identity a ServerApp process has (flwr sets it; a Message needs it)."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class LocalGrid:
    """A Grid whose nodes run our ClientApp in this process. ``down`` nodes are offline (not listed, no
    reply), ``mute`` nodes are listed and say which client they serve but never answer a train message (a
    hung ClientApp); ``slow`` holds (node, round) pairs whose train reply is held back until the next push (a
    node that trains past the round's timeout and answers late); ``tamper`` maps (node, round) to a function
    ``(message, reply) -> reply`` that replaces the node's train reply. ``replies`` keeps every train reply
    as the node gave it, ``sent`` every message pushed."""

    def __init__(self, clients: int, node_config: dict | None = None):
        self.contexts = {}
        self.names: dict[int, str] = {}
        self.down: set[int] = set()
        self.mute: set[int] = set()
        self.slow: set[tuple[int, int]] = set()
        self.tamper: dict = {}
        self.held: dict = {}
        self.outbox: dict = {}
        self.replies: list = []
        self.sent: list = []
        self.pushed = 0
        for client in range(clients):
            self.add_node(100 + client, client, node_config)

    def add_node(self, node: int, client: int, node_config: dict | None = None, name: str = "") -> None:
        from flwr.app import Context, RecordDict

        self.contexts[node] = Context(run_id=1, node_id=node, node_config={"partition-id": client,
                                                                          **(node_config or {})},
                                      state=RecordDict(), run_config={})
        self.names[node] = name

    def get_node_ids(self):
        return [n for n in self.contexts if n not in self.down]

    def get_nodes(self):
        from flwr.proto.node_pb2 import NodeInfo

        return [NodeInfo(node_id=n, name=self.names[n]) for n in self.get_node_ids()]

    def push_messages(self, messages):
        from flwr.app import Message, Metadata

        from federated.flower import client_app

        self.outbox.update(self.held)  # the late replies arrive now, after their round closed
        self.held = {}
        ids = []
        for message in messages:
            self.pushed += 1
            self.sent.append(message)
            node, kind = message.metadata.dst_node_id, message.metadata.message_type
            meta = Metadata(run_id=1, message_id=f"m{self.pushed}", src_node_id=0, dst_node_id=node,
                            reply_to_message_id="", group_id=message.metadata.group_id,
                            created_at=time.time(), ttl=message.metadata.ttl, message_type=kind)
            train = kind.split(".")[0] == "train"  # train.selfpretrain: federated self-pre-training's
            if node not in self.down and not (node in self.mute and train):
                handle = getattr(client_app, ACTIONS.get(kind, kind))
                reply = handle(Message(message.content, metadata=meta), self.contexts[node])
                at = (node, int(message.content["config"]["server-round"])) if train else None
                if train:
                    self.replies.append(reply)
                if at in self.tamper:
                    reply = self.tamper[at](Message(message.content, metadata=meta), reply)
                (self.held if at in self.slow else self.outbox)[meta.message_id] = reply
            ids.append(meta.message_id)
        return ids

    def pull_messages(self, ids):
        return [self.outbox.pop(i) for i in ids if i in self.outbox]


def serve(grid, path, resume=False, stop_after=None, min_replies="1.0", timeout_s=0.5, shards=None,
          names=None, **extra):
    """federate's run (TINY, with ``extra``) into ``path`` with its clients behind ``grid``."""
    from federated.flower.server_app import FlowerDispatch

    cfg = FederateConfig(**{**TINY, **extra})
    opts = RunOptions(out=path, device="cpu", progress=False, engine="flower", resume=resume,
                      stop_after=stop_after, min_replies=min_replies)
    dispatch = FlowerDispatch(grid, "cpu", wait_s=0.5, timeout_s=timeout_s, min_replies=min_replies,
                              shards=shards, names=names)
    return runner.run(cfg, opts, host=lambda _cfg, rounds: rounds(dispatch))


def rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


