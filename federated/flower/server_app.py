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
import sys
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from tqdm import tqdm

from ..algorithms import ClientResult
from ..experiment import FederateConfig, RunOptions, needed_replies
from ..local import DivergenceError
from ..rounds import RoundPlan
from ..runner import run
from ..setup import Setup
from ..shards import check_manifest, partition_settings, read_manifest
from . import FlowerError
from .records import get_tree, put_tree
from .run_config import options_from_run_config

NODE_WAIT_S = 600.0  # s a round waits for enough SuperNodes to be online (the first: for all)
QUERY_S = 30.0  # s a new node has to say which client it serves
PULL_S = 0.1  # between pulls for replies
IN_CONTEXT = {"in-context": True}  # the server's record of a client whose state lives in its Context


class FlowerDispatch:
    """Trains a round's clients through Flower messages (a :data:`federated.rounds.Dispatch`).

    A round goes on when at least ``--min-replies`` of its clients reply: the ones without a node online,
    without a reply within ``--flower-timeout`` or whose node reports an error are left out of it (the round
    loop aggregates over the others and records them as ``missing_clients``); with fewer the run ends in one
    line.
    """

    def __init__(self, grid: Grid, device: str = "auto", wait_s: float = NODE_WAIT_S,
                 timeout_s: float | None = None, min_replies: str = "1.0", shards: Path | None = None):
        self.grid, self.device, self.wait_s, self.timeout_s = grid, device, wait_s, timeout_s
        self.min_replies = min_replies
        self.shards = shards  # the export-partitions directory the nodes' shards came from (None: no shards)
        self.manifest = None if shards is None else read_manifest(shards)  # a bad one: one line, at once
        self.expected: dict[int, str] | None = None  # client -> shard sha256, once checked against the run
        self.nodes: dict[int, int] = {}  # client id -> Flower node id
        self.started = False  # the first round waits for every client's node (up to wait_s)
        self.strangers: set[int] = set()  # nodes not to ask again: out-of-range or superseded partition-ids

    def __call__(self, s: Setup, cfg: FederateConfig, plan: RoundPlan, device: torch.device,
                 bar: tqdm | None) -> tuple[list[ClientResult], list[float]]:
        need = needed_replies(self.min_replies, len(plan.selected))
        if self.manifest is not None and self.expected is None:
            self.expected = check_manifest(self.manifest, partition_settings(cfg), str(self.shards),
                                           [len(p) for p in s.parts])
        nodes = self._nodes(cfg.clients, plan.selected, need)
        config = json.dumps(cfg.to_dict())
        sent = [(i, c) for i, c in enumerate(plan.selected) if c in nodes]
        messages = [self._message(s, cfg, config, plan, i, nodes[c]) for i, c in sent]
        if bar is not None:
            bar.set_postfix_str(f"{len(messages)} Flower clients")
        replies = dict(zip([c for _, c in sent], self._exchange(messages, self.timeout_s), strict=True))
        missing = {c: "no Flower node online" for c in plan.selected if c not in nodes}
        for client, reply in replies.items():
            if reply is None:
                missing[client] = f"no reply within --flower-timeout {self.timeout_s:g} s"
            elif reply.has_error():
                missing[client] = f"its node reported error {reply.error.code}: {reply.error.reason}"
        lost = [c for c, r in replies.items() if c not in missing and _failed(r) == "lost"]
        if lost:
            raise FlowerError(f"client(s) {', '.join(map(str, lost))}: their {cfg.algo} state is gone from "
                              f"their Flower Context (a new Flower run, e.g. after --resume, or a restarted "
                              f"SuperNode); this run cannot continue them: start a new run")
        why = "; ".join(f"client {c}: {reason}" for c, reason in sorted(missing.items()))
        if len(plan.selected) - len(missing) < need:
            raise FlowerError(f"round {plan.rnd + 1}: {len(plan.selected) - len(missing)} of "
                              f"{len(plan.selected)} clients replied, --min-replies {self.min_replies} needs "
                              f"{need} ({why}); the rounds before are kept (--resume continues)")
        if missing:
            tqdm.write(f"federate: round {plan.rnd + 1} goes on without {why}", file=sys.stderr)
        results, losses = [], []
        for client in plan.selected:
            if client not in missing:
                result, loss = self._result(s, client, replies[client], device)
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
        if not messages:
            return []
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
        """A client's reply (the silent and failed nodes are sorted out before) as its ClientResult."""
        if _failed(reply) == "diverged":  # the round loop adds the round to its one line
            raise DivergenceError(str(reply.content["fpsfl.failed"]["reason"]))
        if _failed(reply):
            raise FlowerError(f"client {client}: {reply.content['fpsfl.failed']['reason']}")
        if self.expected is not None:
            node = reply.content["fpsfl.node"] if "fpsfl.node" in reply.content else {}
            got = str(node.get("shard-sha256", "none: its SuperNode has no data-dir"))
            if got != self.expected[client]:
                raise FlowerError(f"client {client}: its node trained on a shard with sha256 {got[:16]}, not "
                                  f"{self.expected[client][:16]} of {self.shards}'s manifest; give it the "
                                  f"manifest's shard (node config data-dir)")
        metrics = reply.content["metrics"]
        if int(metrics["keeps-state"]):
            s.algo.clients[client] = dict(IN_CONTEXT)
        extra = get_tree(reply.content, "fpsfl.extra", device) if "fpsfl.extra" in reply.content else {}
        state = {k: v.to(device) for k, v in reply.content["arrays"].to_torch_state_dict().items()}
        return ClientResult(client, state, int(metrics["num-examples"]), int(metrics["steps"]), extra), \
            float(metrics["train-loss"])

    def _nodes(self, clients: int, selected: list[int], need: int) -> dict[int, int]:
        """Client id -> node id of the nodes online now, once enough of the round's clients have one: all of
        them in the first round, ``need`` later (each waits up to ``wait_s``). A node not seen before (a new
        or restarted SuperNode) is asked its partition-id; one gone is forgotten."""
        deadline = time.monotonic() + self.wait_s
        while True:
            self._learn(clients, set(self.grid.get_node_ids()))
            served = sum(c in self.nodes for c in selected)
            if served >= len(selected) or (served >= need and (self.started or time.monotonic() > deadline)):
                break
            if time.monotonic() > deadline:
                raise FlowerError(f"{served} of the round's {len(selected)} clients have a Flower node "
                                  f"online after {self.wait_s:.0f} s (--min-replies {self.min_replies} "
                                  f"needs {need}); give each SuperNode --node-config "
                                  f"'partition-id=<0..{clients - 1}>'")
            time.sleep(0.2)
        self.started = True
        return self.nodes

    def _learn(self, clients: int, online: set[int]) -> None:
        """Forget the nodes gone offline; ask the new ones which client they serve (a node that does not
        answer within QUERY_S is asked again next time)."""
        self.nodes = {c: n for c, n in self.nodes.items() if n in online}
        new = sorted(online - set(self.nodes.values()) - self.strangers)
        queries = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in new]
        for node, reply in zip(new, self._exchange(queries, QUERY_S), strict=True):
            if reply is None or reply.has_error():
                continue
            pid = int(reply.content["node"]["partition-id"])
            if not 0 <= pid < clients:
                self.strangers.add(node)  # e.g. a SuperNode of another federation: not ours to use
                tqdm.write(f"federate: Flower node {node} serves partition-id {pid}, which a "
                           f"{clients}-client run does not have; it is left out", file=sys.stderr)
            else:
                if pid in self.nodes:  # a restarted SuperNode, its old node not yet offline: the new one wins
                    self.strangers.add(self.nodes[pid])
                    tqdm.write(f"federate: Flower node {node} now serves client {pid} (node "
                               f"{self.nodes[pid]} did before)", file=sys.stderr)
                self.nodes[pid] = node


def _failed(reply: Message) -> str:
    return str(reply.content["fpsfl.failed"]["kind"]) if "fpsfl.failed" in reply.content else ""


def serve(grid: Grid, cfg: FederateConfig, opts: RunOptions) -> list[dict]:
    """federate's run with its clients behind ``grid``; its metrics rows."""
    return run(cfg, opts, host=lambda _cfg, rounds: rounds(
        FlowerDispatch(grid, opts.device, timeout_s=opts.flower_timeout, min_replies=opts.min_replies,
                       shards=opts.shards)))


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp of ``flwr run .``: federate with the settings of the Flower run config."""
    cfg, opts = options_from_run_config(dict(context.run_config))
    serve(grid, cfg, opts)
