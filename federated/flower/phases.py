"""Where a ClientApp process spends its time: the cold-start breakdown of issue 33 (bench/flower.sh).

flwr 1.41 starts a fresh ``flwr-clientapp`` process for every message a SuperNode receives, so each
client-round pays Python's start, Flower's runtime, the app's imports, its data and model again. With
``FPSFL_CLIENT_PHASES=FILE`` in a SuperNode's environment (its ClientApp processes and :mod:`.worker`
inherit it), every process that handles a message appends one JSON line to FILE: its role (``clientapp``
or ``worker``), the message, whether it was the process's first (``cold``), and the CPU seconds (user +
system, this process) and wall seconds of each phase:

- ``runtime``: from the process's start to the app's first line (Python, Flower's runtime and its
  exchange with the SuperNode: message, Context and app bundle);
- ``imports``: torch and the run's code; ``shard``: the node's data; ``model``: the model and algorithm;
- ``train`` (or ``evaluate``): the local training, whose first run in a process also pays torch's one-off
  kernel set-up (bench/flower.sh measures it against a second run in the same process);
- ``forward``: a ClientApp that handed the message to its node's warm worker, waiting for it.

Lean on purpose (stdlib only): it is imported before anything heavy.
"""

from __future__ import annotations

import json
import os
import time

ENV = "FPSFL_CLIENT_PHASES"


def process_age() -> float:
    """Wall seconds since this process started (Linux: /proc), NaN where that is unknown."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class Phases:
    """CPU and wall seconds of consecutive phases of one process's work on a message."""

    def __init__(self, role: str, since_start: bool = False):
        self.role, self.cpu, self.wall = role, {}, {}
        self.cold = since_start  # the process's first message (a long-lived process may say so itself)
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        if since_start:  # the time before this object: the process's own start-up
            self.cpu["runtime"], self.wall["runtime"] = round(self._cpu, 3), round(process_age(), 3)

    def restart(self) -> None:
        """Start the next phase now (the time since the last mark, e.g. idle, is not counted)."""
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def mark(self, phase: str) -> None:
        """The phase that ends now (a phase marked twice adds up)."""
        cpu, wall = time.process_time(), time.perf_counter()
        self.cpu[phase] = round(self.cpu.get(phase, 0.0) + cpu - self._cpu, 3)
        self.wall[phase] = round(self.wall.get(phase, 0.0) + wall - self._wall, 3)
        self._cpu, self._wall = cpu, wall

    def write(self, **facts) -> None:
        """Append this process's line to $FPSFL_CLIENT_PHASES (nothing when it is unset)."""
        path = os.environ.get(ENV)
        if not path:
            return
        line = json.dumps({"role": self.role, "pid": os.getpid(), **facts, "cpu": self.cpu,
                           "wall": self.wall})
        with open(path, "a") as f:  # one short line per message: appends of processes do not interleave
            f.write(line + "\n")
