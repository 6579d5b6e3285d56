"""The server side of the Flower engine's rounds: a dispatcher for our round loop.

:class:`FlowerDispatch` is what :func:`federated.rounds.train_round` calls to train a round's clients: one
standard ``train`` Flower message per selected client (see :mod:`.node` for what it carries), each with a
``ttl`` of the round's ``--flower-timeout`` and the round as its ``group_id``, pushed through the ServerApp's
Grid; the replies are matched to the messages by ``reply_to_message_id``, read and checked
(:mod:`.replies`: the server trusts no reply) and turned back into
:class:`federated.algorithms.ClientResult` objects in the round's order. Everything else (planning,
aggregation with the algorithm's ``aggregate``, evaluation, metrics, checkpoints, ``--resume``) is the
in-process engine's code (Beutel et al. 2020 for Flower; McMahan et al. 2017, Algorithm 1).

A round goes on when at least ``--min-replies`` of its clients give a reply it takes; the others (no node
online, no reply within ``--flower-timeout``, an error, a refused reply) are missing from it, each with its
reason in metrics.jsonl (``missing_reasons``). A reply that comes after its round closed is discarded and
named (``late_replies``): the round it belonged to was aggregated without it.

The server holds only server state: a client's algorithm state stays in its node's Flower Context. Of it
the server keeps the last round whose reply of that client it aggregated (``algo.clients[i]`` is
``{"in-context": True, "round": r}``, saved in state.pt) and sends it with every message (``confirmed``):
the node commits the state of that round and discards what later replies produced, so what the node holds
is always what the server aggregated; a Context found without it (a new Flower run after ``--resume``, a
restarted SuperNode) is named in one line instead of silently restarted from zero.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from tqdm import tqdm

from ..algorithms import ClientResult
from ..experiment import FederateConfig, RunOptions, needed_replies
from ..local import DivergenceError
from ..rounds import RoundPlan
from ..setup import Setup
from ..shards import check_manifest, partition_settings, read_manifest
from . import FlowerError
from .nodes import NodeBook, node_names
from .records import put_tree, state_record
from .replies import Refused, error_kind, read_reply

PULL_S = 0.1  # between pulls for replies
# flwr.common.constant.ErrorCode's MESSAGE_UNAVAILABLE and REPLY_MESSAGE_UNAVAILABLE: the SuperLink's answer
# for a message (or reply) whose ttl, the round's timeout, ran out
EXPIRED = (3, 4)


class FlowerDispatch:
    """Trains a round's clients through Flower messages (a :data:`federated.rounds.Dispatch`)."""

    def __init__(self, grid: Grid, device: str = "auto", wait_s: float = 600.0,
                 timeout_s: float | None = None, min_replies: str = "1.0", shards: Path | None = None,
                 names: str | None = None):
        self.grid, self.device, self.wait_s, self.timeout_s = grid, device, wait_s, timeout_s
        self.min_replies, self.names = min_replies, names
        self.shards = shards  # the export-partitions directory the nodes' shards came from (None: no shards)
        self.manifest = None if shards is None else read_manifest(shards)  # a bad one: one line, at once
        self.expected: dict[int, str] | None = None  # client -> shard sha256, once checked against the run
        self.book: NodeBook | None = None
        self.late: dict[str, tuple[int, int]] = {}  # message id -> (client, round) unanswered when it closed
        self.late_seen: list[list[int]] = []  # [client, round] of the late replies discarded this round

    def __call__(self, s: Setup, cfg: FederateConfig, plan: RoundPlan, device: torch.device,
                 bar: tqdm | None) -> tuple[list[ClientResult], list[float], dict]:
        need = needed_replies(self.min_replies, len(plan.selected))
        if self.manifest is not None and self.expected is None:
            self.expected = check_manifest(self.manifest, partition_settings(cfg), str(self.shards),
                                           [len(p) for p in s.parts])
        if self.book is None:
            self.book = NodeBook(self.grid, self._exchange, self.wait_s, node_names(self.names, cfg.clients))
        nodes = self.book.online(cfg.clients, plan.selected, need, f"--min-replies {self.min_replies}")
        config = json.dumps(cfg.to_dict())
        sent = [(i, c) for i, c in enumerate(plan.selected) if c in nodes]
        messages = [self._message(s, cfg, config, plan, i, nodes[c]) for i, c in sent]
        if bar is not None:
            bar.set_postfix_str(f"{len(messages)} Flower clients")
        # late replies are watched for two rounds (Flower answers an expired message's id with an error)
        self.late = {i: who for i, who in self.late.items() if who[1] >= plan.rnd - 1}
        answers = self._exchange(messages, self.timeout_s, [(c, plan.rnd + 1) for _, c in sent])
        replies = dict(zip([c for _, c in sent], answers, strict=True))
        missing = {c: "no Flower node online" for c in plan.selected if c not in nodes}
        taken: dict[int, tuple[ClientResult, float, bool]] = {}
        lost = []
        for i, client in sent:
            reply = replies[client]
            if reply is None or (reply.has_error() and int(reply.error.code) in EXPIRED):
                limit = f"--flower-timeout {self.timeout_s:g} s" if self.timeout_s else "its message's ttl"
                missing[client] = f"no reply within {limit}"
            elif error_kind(reply) == "lost":
                lost.append(client)
            elif error_kind(reply) == "diverged":  # the round loop adds the round to its one line
                raise DivergenceError(reply.error.reason)
            elif reply.has_error():
                missing[client] = f"its node reported error {reply.error.code}: {reply.error.reason}"
            else:
                try:
                    result, loss = read_reply(s, cfg, plan, i, reply, device,
                                              None if self.expected is None else self.expected[client])
                except Refused as exc:
                    missing[client] = f"its reply was refused: {exc}"
                else:
                    taken[client] = (result, loss, bool(int(reply.content["metrics"].get("keeps-state", 0))))
        if lost:
            raise FlowerError(f"client(s) {', '.join(map(str, lost))}: their {cfg.algo} state is gone from "
                              f"their Flower Context (a new Flower run, e.g. after --resume, or a restarted "
                              f"SuperNode); this run cannot continue them: start a new run")
        why = "; ".join(f"client {c}: {reason}" for c, reason in sorted(missing.items()))
        if len(taken) < need:
            raise FlowerError(f"round {plan.rnd + 1}: {len(taken)} of {len(plan.selected)} clients replied, "
                              f"--min-replies {self.min_replies} needs {need} ({why}); the rounds before are "
                              f"kept (--resume continues)")
        if missing:
            tqdm.write(f"federate: round {plan.rnd + 1} goes on without {why}", file=sys.stderr)
        for client, (_, _, keeps) in taken.items():  # the node commits this round's state on our next message
            if keeps:
                s.algo.clients[client] = {"in-context": True, "round": plan.rnd + 1}
        notes: dict = {}
        if missing:
            notes["missing_reasons"] = {str(c): reason for c, reason in sorted(missing.items())}
        if self.late_seen:
            notes["late_replies"], self.late_seen = self.late_seen, []
        ordered = [taken[c] for c in plan.selected if c in taken]
        return [r for r, _, _ in ordered], [loss for _, loss, _ in ordered], notes

    def _message(self, s: Setup, cfg: FederateConfig, config: str, plan: RoundPlan, i: int,
                 node: int) -> Message:
        client = plan.selected[i]
        held = s.algo.clients[client]
        # the last round whose reply of this client was aggregated (-1: a record without it, never a round)
        confirmed = int(held.get("round", -1)) if held.get("in-context") else 0
        content = RecordDict({
            "arrays": state_record(plan.global_state),
            "config": ConfigRecord({"server-round": plan.rnd + 1, "lr": plan.lr, "client": client,
                                    "confirmed": confirmed, "device": self.device, "fpsfl-config": config})})
        reads = {k: s.algo.server[k] for k in type(s.algo).client_reads if k in s.algo.server}
        if reads:
            put_tree(content, "fpsfl.server", reads)
        pools, whole = plan.pools[i], s.parts[client]
        if len(pools) != cfg.local_epochs or any(not torch.equal(p.cpu(), whole) for p in pools):
            put_tree(content, "fpsfl.pools", {str(e): pool for e, pool in enumerate(pools)})
        # ttl: an undelivered message dies with its round, so a slow node never runs an abandoned round
        return Message(content, dst_node_id=node, message_type="train", ttl=self.timeout_s,
                       group_id=str(plan.rnd + 1))

    def _exchange(self, messages: list[Message], timeout_s: float | None = None,
                  late_as: list[tuple[int, int]] | None = None) -> list[Message | None]:
        """Each message's reply (None: none came within ``timeout_s``), matched by ``reply_to_message_id``.
        With ``late_as`` ((client, round) of each message), the unanswered ones are remembered: a reply
        that still comes is discarded and named (:meth:`_late`)."""
        if not messages:
            return []
        ids = [str(i) for i in self.grid.push_messages(messages)]
        replies: dict[str, Message] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(replies) < len(ids) and (deadline is None or time.monotonic() < deadline):
            for reply in self.grid.pull_messages([i for i in ids if i not in replies] + list(self.late)):
                if reply.metadata.reply_to_message_id in self.late:
                    self._late(reply)
                else:
                    replies[reply.metadata.reply_to_message_id] = reply
            if len(replies) < len(ids):
                time.sleep(PULL_S)
        if late_as is not None:
            self.late.update({i: who for i, who in zip(ids, late_as, strict=True) if i not in replies})
        return [replies.get(i) for i in ids]

    def _late(self, reply: Message) -> None:
        """A reply to a train message whose round has closed: discarded (its client was missing there)."""
        client, rnd = self.late.pop(reply.metadata.reply_to_message_id)
        if not reply.has_error():  # Flower's own answer for an expired message is no reply: nothing to say
            self.late_seen.append([client, rnd])
            tqdm.write(f"federate: client {client}'s reply to round {rnd} came after that round closed; "
                       f"it is discarded", file=sys.stderr)


def dispatch_for(grid: Grid, opts: RunOptions) -> FlowerDispatch:
    """The dispatcher of a run with these options, its clients behind ``grid``."""
    return FlowerDispatch(grid, opts.device, wait_s=opts.node_wait, timeout_s=opts.flower_timeout,
                          min_replies=opts.min_replies, shards=opts.shards, names=opts.node_names)
