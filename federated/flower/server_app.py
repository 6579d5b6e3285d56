"""The server side of ``--engine flower``: a dispatcher for our round loop, and a deployment's ServerApp.

:class:`FlowerDispatch` is what :func:`federated.rounds.train_round` calls to train a round's clients: one
``train`` Flower message per selected client (see :mod:`.client_app`) sent through the ServerApp's Grid,
and the replies turned back into :class:`federated.algorithms.ClientResult` objects in the round's order.
Everything else (planning, aggregation with the algorithm's ``aggregate``, evaluation, metrics, checkpoints,
``--resume``, tracking) is the in-process engine's code (Beutel et al. 2020 for Flower; McMahan et al. 2017,
Algorithm 1 for the round).

The server holds the authoritative copy of every client's algorithm state (``algo.clients[i]``), updated
from each reply and saved in ``state.pt`` with the round; the client works on the copy in its Flower Context,
which this ServerApp run seeds with its first message to that client (needed after ``--resume``: Flower
Contexts start empty in a new run).

``app`` is the ServerApp of a deployment (``flwr run recipes/flower``; see recipes/flower_deploy.sh): it
reads federate's flags from the run config ``federate`` and runs :func:`federated.runner.run` on the Grid.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from tqdm import tqdm

from ..algorithms import ClientResult
from ..experiment import FederateConfig
from ..local import DivergenceError
from ..rounds import RoundPlan
from ..setup import Setup
from . import FlowerError
from .records import get_state, get_tree, put_state, put_tree

NODE_WAIT_S = 600.0  # how long a deployment waits for its SuperNodes to connect


class FlowerDispatch:
    """Trains a round's clients through Flower messages (a :data:`federated.rounds.Dispatch`)."""

    def __init__(self, grid: Grid, device: str = "auto", wait_s: float = NODE_WAIT_S):
        self.grid, self.device, self.wait_s = grid, device, wait_s
        self.nodes: dict[int, int] | None = None  # client id -> Flower node id
        self.seeded: set[int] = set()  # clients whose Context holds the server's copy of their state

    def __call__(self, s: Setup, cfg: FederateConfig, plan: RoundPlan, device: torch.device,
                 bar: tqdm | None) -> tuple[list[ClientResult], list[float]]:
        nodes = self._nodes(cfg.clients)
        config = json.dumps(cfg.to_dict())
        messages = [self._message(s, config, plan, i, nodes[c]) for i, c in enumerate(plan.selected)]
        if bar is not None:
            bar.set_postfix_str(f"{len(messages)} Flower clients")
        replies = {r.metadata.src_node_id: r for r in self.grid.send_and_receive(messages)}
        results, losses = [], []
        for client in plan.selected:
            result, loss = self._result(s, client, replies.get(nodes[client]), device)
            results.append(result)
            losses.append(loss)
        return results, losses

    def _message(self, s: Setup, config: str, plan: RoundPlan, i: int, node: int) -> Message:
        client = plan.selected[i]
        seed = client not in self.seeded
        content = RecordDict({"job": ConfigRecord({"config": config, "rnd": plan.rnd, "lr": plan.lr,
                                                   "client": client, "device": self.device, "seed": seed})})
        put_state(content, "global", plan.global_state)
        put_tree(content, "pools", {str(e): pool for e, pool in enumerate(plan.pools[i])})
        put_tree(content, "server", s.algo.server)
        if seed:
            put_tree(content, "client", s.algo.clients[client])
        return Message(content, dst_node_id=node, message_type="train")

    def _result(self, s: Setup, client: int, reply: Message | None,
                device: torch.device) -> tuple[ClientResult, float]:
        """A client's reply as its ClientResult; its state and any new server state are kept here."""
        if reply is None:
            raise FlowerError(f"client {client}: no reply from its Flower node")
        if reply.has_error():
            raise FlowerError(f"client {client}: its ClientApp failed: {reply.error.reason}")
        if "failed" in reply.content:
            failed = reply.content["failed"]
            error = DivergenceError if failed["kind"] == "diverged" else FlowerError
            raise error(str(failed["reason"]))
        meta = reply.content["result"]
        s.algo.clients[client] = get_tree(reply.content, "client")
        self.seeded.add(client)
        for key, value in get_tree(reply.content, "server_new", device).items():
            s.algo.server.setdefault(key, value)
        result = ClientResult(client, get_state(reply.content, "state", device), int(meta["n_samples"]),
                              int(meta["steps"]), get_tree(reply.content, "extra", device))
        return result, float(meta["loss"])

    def _nodes(self, clients: int) -> dict[int, int]:
        """Client id -> node id, asked once of every connected node (its partition-id node config)."""
        if self.nodes is not None:
            return self.nodes
        deadline = time.monotonic() + self.wait_s
        while len(ids := list(self.grid.get_node_ids())) < clients:
            if time.monotonic() > deadline:
                raise FlowerError(f"{len(ids)} of {clients} Flower nodes connected after {self.wait_s:.0f} s")
            time.sleep(0.2)
        queries = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in ids]
        nodes: dict[int, int] = {}
        for reply in self.grid.send_and_receive(queries, timeout=self.wait_s):
            if reply.has_error():
                raise FlowerError(f"Flower node {reply.metadata.src_node_id}: {reply.error.reason}")
            pid = int(reply.content["node"]["partition-id"])
            if pid in nodes:
                raise FlowerError(f"two Flower nodes say they are client {pid} (partition-id)")
            nodes[pid] = reply.metadata.src_node_id
        missing = sorted(set(range(clients)) - set(nodes))
        if missing:
            raise FlowerError(f"no Flower node serves client(s) {missing}: give each SuperNode "
                              f"--node-config 'partition-id=<0..{clients - 1}>'")
        self.nodes = nodes
        return nodes


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """A deployment's ServerApp: ``federate`` with the flags of the run config ``federate`` (a string)."""
    from ..cli import build_parser, options_from  # the CLI module needs this one's package only here
    from ..runner import run

    args = build_parser().parse_args(shlex.split(str(context.run_config.get("federate", ""))))
    cfg, opts = options_from(args)
    run(cfg, dataclasses.replace(opts, engine="flower"), dispatch=FlowerDispatch(grid, opts.device))
