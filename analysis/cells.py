"""One table cell: runs that differ only in their seed, pooled as mean ± std (Chen et al., ICLR 2023,
Tables 2-5). Shared by :mod:`.report` (our tables) and :mod:`.paper` (the paper's tables beside ours).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from federated.partitions import headline, headlines

MISSING = "–"
# fields that never change what a run measures, so runs differing in them pool as seeds
IGNORED = frozenset({"seed", "data_root", "download", "save_local_models", "tracking", "eval_local"})
CL_IGNORED = IGNORED | {"algo", "algo_args", "participation"}  # a centralised run has no federation


class Entry(NamedTuple):
    config: Any  # a FederateConfig, or any object with its attributes
    acc: float  # final test_acc, a fraction
    name: str = ""  # the run's name, for the JSON


@dataclass
class Cell:
    """The runs pooled in one table cell; values in percent."""

    entries: list[Entry]

    @property
    def values(self) -> list[float]:
        return [100.0 * e.acc for e in self.entries]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def std(self) -> float | None:
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else None

    def text(self) -> str:
        n = len(self.values)
        return f"{self.mean:.1f}" if n == 1 else f"{self.mean:.1f} ± {self.std:.1f} (n={n})"

    def record(self) -> dict:
        return {"mean": self.mean, "std": self.std, "n": len(self.values), "values": self.values,
                "seeds": [e.config.seed for e in self.entries], "runs": [e.name for e in self.entries]}


def init_label(init: str) -> str:
    """random, imagenet, places365, or a checkpoint's file stem (``/x/fps.ckpt`` -> ``fps``)."""
    if init.startswith("places365:"):
        return "places365"
    return init if init in ("random", "imagenet") else Path(init).stem


def _flat(cfg: Any) -> dict[str, Any]:
    """A config's settings by name, the partition settings among them (FederateConfig keeps those apart)."""
    values = dict(vars(cfg))
    partition = values.pop("partition_args", {})
    return {**values, **partition}


def pool_notes(cell: Cell, ignored: frozenset[str], where: str) -> list[str]:
    """Warnings about a cell that pools more than seeds: differing settings or repeated seeds."""
    fields = [_flat(e.config) for e in cell.entries]
    first = fields[0]
    moot = set(headlines().values()) - {headline(first["partition"])}  # e.g. alpha for iid
    ignored = ignored | moot
    differ = sorted(k for k in first if k not in ignored and any(f.get(k) != first[k] for f in fields))
    seeds = [e.config.seed for e in cell.entries]
    notes = [f"{where} pools runs that differ in {', '.join(differ)}"] if differ else []
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        notes.append(f"{where} has several runs with seed {', '.join(map(str, repeated))}")
    return notes


