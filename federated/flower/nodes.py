"""Which Flower node serves which client: the server's book of SuperNodes (Beutel et al. 2020, Flower).

Nodes are re-sampled every round: one gone offline is forgotten; a new one (a SuperNode started late, or
restarted) is asked which client it serves (a ``query`` message: its node config's ``partition-id``, and
``num-partitions`` where its federation sets it, as Flower's simulation does).

Who may serve a client depends on the deployment:

- **Without node names** (Flower's simulation; a SuperLink without ``--enable-supernode-auth``): a node serves
  the partition-id it reports, and of two nodes that report the same one the newer wins (a restarted
  SuperNode comes back under a new node id). Nothing more can be checked: any process that reaches such a
  SuperLink can take a client's place, so a deployment across machines should authenticate its nodes.
- **With node names** (``node-names``; a SuperLink with ``--enable-supernode-auth``, whose nodes are only
  those registered with ``flwr supernode register KEY.pub --name NAME``, each proving its key on every call):
  client i is served only by the node registered under client i's name. A node whose registered name is
  not one of the run's, or that claims another client's partition-id, is left out with one line naming
  both nodes; the identity comes from the SuperLink's registry, never from what the node says.

A node whose federation has another number of partitions than the run has clients (Flower's simulation with
its default of 2 SuperNodes under ``clients = 10``) ends the run at once, in one line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from tqdm import tqdm

from . import FlowerError

QUERY_S = 30.0  # s a new node has to say which client it serves


def node_names(spec: str | None, clients: int) -> list[str] | None:
    """Client i's registered node name under ``spec`` (a comma-separated list, or a pattern with {i});
    None without a spec. A ValueError (one line) for a list of another length or with repeated names."""
    if not spec:
        return None
    names = ([spec.replace("{i}", str(i)) for i in range(clients)] if "{i}" in spec
             else [n.strip() for n in spec.split(",")])
    if len(names) != clients or len(set(names)) != clients or not all(names):
        raise ValueError(f"node-names {spec!r}: expected {clients} distinct names (one per client, "
                         f"comma-separated) or a pattern with {{i}}")
    return names


class NodeBook:
    """Client id -> Flower node id of the nodes online now, kept up to date round by round."""

    def __init__(self, grid: Grid, exchange: Callable[[list[Message], float], list[Message | None]],
                 wait_s: float, names: list[str] | None = None):
        self.grid, self.exchange, self.wait_s, self.names = grid, exchange, wait_s, names
        self.nodes: dict[int, int] = {}  # client id -> node id
        self.started = False  # the first round waits for every client's node (up to wait_s)
        self.strangers: set[int] = set()  # nodes not to ask again: left out, or superseded

    def online(self, clients: int, selected: list[int], need: int, why: str) -> dict[int, int]:
        """Client id -> node id once enough of the round's clients have a node: all of them in the first
        round, ``need`` later (each waits up to ``wait_s``); ``why`` says where ``need`` comes from."""
        deadline = time.monotonic() + self.wait_s
        while True:
            self._learn(clients, {info.node_id: info for info in self.grid.get_nodes()})
            served = sum(c in self.nodes for c in selected)
            if served >= len(selected) or (served >= need and (self.started or time.monotonic() > deadline)):
                break
            if time.monotonic() > deadline:
                raise FlowerError(f"{served} of the round's {len(selected)} clients have a Flower node "
                                  f"online after {self.wait_s:.0f} s ({why} needs {need}); give each "
                                  f"SuperNode --node-config 'partition-id=<0..{clients - 1}>'")
            time.sleep(0.2)
        self.started = True
        return self.nodes

    def _learn(self, clients: int, online: dict) -> None:
        """Forget the nodes gone offline; ask the new ones which client they serve (a node that does not
        answer within QUERY_S is asked again next time)."""
        self.nodes = {c: n for c, n in self.nodes.items() if n in online}
        self.strangers &= set(online)  # one that went offline and came back is asked again
        new = sorted(set(online) - set(self.nodes.values()) - self.strangers)
        queries = [Message(RecordDict(), dst_node_id=node, message_type="query", ttl=QUERY_S) for node in new]
        claims = []  # (node, its registered name, the partition-id it reports)
        for node, reply in zip(new, self.exchange(queries, QUERY_S), strict=True):
            if reply is None or reply.has_error():
                continue
            facts = reply.content["node"]
            partitions = int(facts.get("num-partitions", 0))
            if partitions and partitions != clients:
                raise FlowerError(f"the run has clients={clients}, but its Flower federation has "
                                  f"num-partitions={partitions} (e.g. flwr run's --federation-config "
                                  f"num-supernodes={partitions}); make the two equal")
            claims.append((node, str(getattr(online[node], "name", "") or ""), int(facts["partition-id"])))
        if self.names is None:
            for node, _, pid in claims:
                self._trust(node, pid, clients)
            return
        names = self.names
        claims.sort(key=lambda c: c[1] not in names or names.index(c[1]) != c[2])  # the rightful first
        for node, name, pid in claims:
            self._bind(node, name, pid, clients)

    def _trust(self, node: int, pid: int, clients: int) -> None:
        """No identities to check: the node serves the partition-id it reports; the newest node wins."""
        if not 0 <= pid < clients:
            self._leave_out(node, f"serves partition-id {pid}, which a {clients}-client run does not have")
            return
        if pid in self.nodes:  # a restarted SuperNode, its old node not yet offline: the new one wins
            self.strangers.add(self.nodes[pid])
            _say(f"Flower node {node} now serves client {pid} (node {self.nodes[pid]} did before)")
        self.nodes[pid] = node

    def _bind(self, node: int, name: str, pid: int, clients: int) -> None:
        """The node serves the client it is registered for, if its partition-id says the same."""
        assert self.names is not None
        if name not in self.names:
            self._leave_out(node, f"is registered as {name!r}, which is none of this run's node-names")
        elif pid != (owner := self.names.index(name)):
            claimed = (f"client {pid}'s, registered as {self.names[pid]!r}"
                       + (f" (node {self.nodes[pid]})" if pid in self.nodes else "")
                       if 0 <= pid < clients else f"none of this {clients}-client run's")
            self._leave_out(node, f"registered as {name!r} for client {owner}, claims partition-id {pid}, "
                                  f"which is {claimed}")
        elif owner in self.nodes:
            self._leave_out(node, f"is registered as {name!r} too, which node {self.nodes[owner]} serves")
        else:
            self.nodes[owner] = node

    def _leave_out(self, node: int, why: str) -> None:
        self.strangers.add(node)
        _say(f"Flower node {node} {why}; it is left out")


def _say(line: str) -> None:
    tqdm.write(f"federate: {line}", file=sys.stderr)
