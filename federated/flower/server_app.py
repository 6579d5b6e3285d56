"""The server side of the Flower engine: a dispatcher for our round loop, and the app's ServerApp.

:class:`FlowerDispatch` is what :func:`federated.rounds.train_round` calls to train a round's clients: one
standard ``train`` Flower message per selected client (see :mod:`.client_app` for what it carries) pushed
through the ServerApp's Grid, the replies matched to the messages by ``reply_to_message_id`` and turned
back into :class:`federated.algorithms.ClientResult` objects in the round's order. Everything else
(planning, aggregation with the algorithm's ``aggregate``, evaluation, metrics, checkpoints, ``--resume``)
is the in-process engine's code (Beutel et al. 2020 for Flower; McMahan et al. 2017, Algorithm 1).

The server holds only server state: a client's algorithm state stays in its node's Flower Context, and the
server keeps of it only whether the client has some (``algo.clients[i]`` is ``{"in-context": True}``), so
that a Context found empty later (a new Flower run after ``--resume``, a restarted SuperNode) is named
instead of silently restarted from zero.

``app`` is the ServerApp of ``flwr run .`` (pyproject.toml ``[tool.flwr.app]``): it reads federate's
settings from the typed run config (:mod:`.run_config`) and runs :func:`federated.runner.run` on the Grid.
"""

from __future__ import annotations

import json
import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from tqdm import tqdm

from ..algorithms import ClientResult
from ..experiment import FederateConfig, RunOptions
from ..local import DivergenceError
from ..rounds import RoundPlan
from ..runner import run
from ..setup import Setup
from . import FlowerError
from .records import get_tree, put_tree
from .run_config import options_from_run_config

NODE_WAIT_S = 600.0  # how long a deployment waits for its SuperNodes to connect
PULL_S = 0.1  # between pulls for replies
IN_CONTEXT = {"in-context": True}  # the server's record of a client whose state lives in its Context


class FlowerDispatch:
    """Trains a round's clients through Flower messages (a :data:`federated.rounds.Dispatch`)."""

    def __init__(self, grid: Grid, device: str = "auto", wait_s: float = NODE_WAIT_S,
                 timeout_s: float | None = None):
        self.grid, self.device, self.wait_s, self.timeout_s = grid, device, wait_s, timeout_s
        self.nodes: dict[int, int] = {}  # client id -> Flower node id

    def __call__(self, s: Setup, cfg: FederateConfig, plan: RoundPlan, device: torch.device,
                 bar: tqdm | None) -> tuple[list[ClientResult], list[float]]:
        nodes = self._nodes(cfg.clients)
        config = json.dumps(cfg.to_dict())
        messages = [self._message(s, cfg, config, plan, i, nodes[c]) for i, c in enumerate(plan.selected)]
        if bar is not None:
            bar.set_postfix_str(f"{len(messages)} Flower clients")
        replies = self._exchange(messages, self.timeout_s)
        silent = [c for c, r in zip(plan.selected, replies, strict=True) if r is None]
        if silent:
            raise FlowerError(f"client(s) {', '.join(map(str, silent))}: no reply within --flower-timeout "
                              f"{self.timeout_s:g} s; the rounds before are kept (--resume continues)")
        lost = [c for c, r in zip(plan.selected, replies, strict=True)
                if r is not None and not r.has_error() and _failed(r) == "lost"]
        if lost:
            raise FlowerError(f"client(s) {', '.join(map(str, lost))}: their {cfg.algo} state is gone from "
                              f"their Flower Context (a new Flower run, e.g. after --resume, or a restarted "
                              f"SuperNode); this run cannot continue them: start a new run")
        results, losses = [], []
        for client, reply in zip(plan.selected, replies, strict=True):
            result, loss = self._result(s, client, reply, device)
            results.append(result)
            losses.append(loss)
        return results, losses

    def _message(self, s: Setup, cfg: FederateConfig, config: str, plan: RoundPlan, i: int,
                 node: int) -> Message:
        client = plan.selected[i]
        content = RecordDict({
            "arrays": ArrayRecord({k: v.detach().cpu() for k, v in plan.global_state.items()}),
            "config": ConfigRecord({"server-round": plan.rnd + 1, "lr": plan.lr, "client": client,
                                    "expect-state": bool(s.algo.clients[client]), "device": self.device,
                                    "fpsfl-config": config})})
        reads = {k: s.algo.server[k] for k in type(s.algo).client_reads if k in s.algo.server}
        if reads:
            put_tree(content, "fpsfl.server", reads)
        pools, whole = plan.pools[i], s.parts[client]
        if len(pools) != cfg.local_epochs or any(not torch.equal(p.cpu(), whole) for p in pools):
            put_tree(content, "fpsfl.pools", {str(e): pool for e, pool in enumerate(pools)})
        return Message(content, dst_node_id=node, message_type="train")

    def _exchange(self, messages: list[Message], timeout_s: float | None = None) -> list[Message | None]:
        """Each message's reply (None: none came within ``timeout_s``), matched by ``reply_to_message_id``."""
        ids = [str(i) for i in self.grid.push_messages(messages)]
        replies: dict[str, Message] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(replies) < len(ids) and (deadline is None or time.monotonic() < deadline):
            for reply in self.grid.pull_messages([i for i in ids if i not in replies]):
                replies[reply.metadata.reply_to_message_id] = reply
            if len(replies) < len(ids):
                time.sleep(PULL_S)
        return [replies.get(i) for i in ids]

    def _result(self, s: Setup, client: int, reply: Message,
                device: torch.device) -> tuple[ClientResult, float]:
        """A client's reply (the silent ones are refused before) as its ClientResult."""
        if reply.has_error():
            raise FlowerError(f"client {client}: its Flower node reported error {reply.error.code}: "
                              f"{reply.error.reason}")
        if _failed(reply):
            failed = reply.content["fpsfl.failed"]
            error = DivergenceError if failed["kind"] == "diverged" else FlowerError
            raise error(str(failed["reason"]))
        metrics = reply.content["metrics"]
        if int(metrics["keeps-state"]):
            s.algo.clients[client] = dict(IN_CONTEXT)
        extra = get_tree(reply.content, "fpsfl.extra", device) if "fpsfl.extra" in reply.content else {}
        state = {k: v.to(device) for k, v in reply.content["arrays"].to_torch_state_dict().items()}
        return ClientResult(client, state, int(metrics["num-examples"]), int(metrics["steps"]), extra), \
            float(metrics["train-loss"])

    def _nodes(self, clients: int) -> dict[int, int]:
        """Client id -> node id of the nodes online now: a node not seen before (a new or restarted
        SuperNode) is asked its partition-id; one gone is forgotten."""
        deadline = time.monotonic() + self.wait_s
        while len(ids := set(self.grid.get_node_ids())) < clients:
            if time.monotonic() > deadline:
                raise FlowerError(f"{len(ids)} of {clients} Flower nodes connected after {self.wait_s:.0f} s")
            time.sleep(0.2)
        self.nodes = {c: n for c, n in self.nodes.items() if n in ids}
        new = sorted(ids - set(self.nodes.values()))
        queries = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in new]
        for node, reply in zip(new, self._exchange(queries, self.wait_s) if queries else [], strict=True):
            if reply is None or reply.has_error():
                raise FlowerError(f"Flower node {node}: {reply.error.reason if reply else 'no reply'}")
            pid = int(reply.content["node"]["partition-id"])
            if pid in self.nodes:
                raise FlowerError(f"two Flower nodes say they are client {pid} (partition-id)")
            self.nodes[pid] = node
        missing = sorted(set(range(clients)) - set(self.nodes))
        if missing:
            raise FlowerError(f"no Flower node serves client(s) {missing}: give each SuperNode "
                              f"--node-config 'partition-id=<0..{clients - 1}>'")
        return self.nodes


def _failed(reply: Message) -> str:
    return str(reply.content["fpsfl.failed"]["kind"]) if "fpsfl.failed" in reply.content else ""


def serve(grid: Grid, cfg: FederateConfig, opts: RunOptions) -> list[dict]:
    """federate's run with its clients behind ``grid``; its metrics rows."""
    return run(cfg, opts, host=lambda _cfg, rounds: rounds(
        FlowerDispatch(grid, opts.device, timeout_s=opts.flower_timeout)))


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp of ``flwr run .``: federate with the settings of the Flower run config."""
    cfg, opts = options_from_run_config(dict(context.run_config))
    serve(grid, cfg, opts)
