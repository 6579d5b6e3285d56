"""Bytes per round that --engine flower's messages carry, per algorithm (issue 25): every message the
ServerApp pushes and every reply it pulls, serialised as Flower's protobuf (flwr.common.serde), summed over a
run and divided by its rounds. Runs Flower's simulation engine through ``federate --engine flower``.

Usage: python bench/flower_bytes.py [ALGO ...]   (default: fedavg scaffold moon; digits, 10 clients,
Dir(0.3), 2 rounds, 1 local epoch, seed 0). One JSON line per algorithm.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from flwr.common.serde import message_to_proto
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from federated.cli import main

COUNT = {"down": 0, "up": 0, "down_msgs": 0, "up_msgs": 0}
_push, _pull = InMemoryGrid.push_messages, InMemoryGrid.pull_messages


def _size(msg) -> int:
    return len(message_to_proto(msg).SerializeToString())


def push(self, messages):
    messages = list(messages)
    for m in messages:
        if m.metadata.message_type == "train":
            COUNT["down"] += _size(m)
            COUNT["down_msgs"] += 1
    return _push(self, messages)


def pull(self, ids):
    replies = list(_pull(self, ids))
    for m in replies:
        if m.metadata.message_type == "train":
            COUNT["up"] += _size(m)
            COUNT["up_msgs"] += 1
    return replies


InMemoryGrid.push_messages, InMemoryGrid.pull_messages = push, pull
ROUNDS = 2
for algo in sys.argv[1:] or ["fedavg", "scaffold", "moon"]:
    COUNT.update(down=0, up=0, down_msgs=0, up_msgs=0)
    with tempfile.TemporaryDirectory() as tmp:
        code = main(["--dataset", "digits", "--clients", "10", "--rounds", str(ROUNDS), "--local-epochs",
                     "1", "--algo", algo, "--seed", "0", "--no-eval-local", "--device", "cpu", "--engine",
                     "flower", "--out", str(Path(tmp) / "run"), "--quiet"])
    assert code == 0, code
    print(json.dumps({"algo": algo, "rounds": ROUNDS, "clients": 10,
                      "down_bytes_per_round": COUNT["down"] // ROUNDS,
                      "up_bytes_per_round": COUNT["up"] // ROUNDS,
                      "messages": [COUNT["down_msgs"], COUNT["up_msgs"]]}), flush=True)
