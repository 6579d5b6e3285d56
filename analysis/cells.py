"""One table cell: runs that differ only in their seed, pooled as mean ± std (Chen et al., ICLR 2023,
Tables 2-5). Shared by :mod:`.report` (our tables) and :mod:`.paper` (the paper's tables beside ours).

Runs pool only when what they were made from is the same (:func:`inputs_of`): every setting but
:data:`IGNORED` ones (seed, where the data lies, what is saved or tracked beside the result) and the partition
settings the run's partition does not use, the sha256 of the ``--init`` file and the resolved algorithm
settings its config.json records. Runs whose inputs differ are separate rows or refused, never one cell.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from federated.partitions import PARTITIONS, setting_fields

from .runs import AnalysisError

MISSING = "–"
# fields that never change what a run measures, so runs differing in them pool as seeds
IGNORED = frozenset({"seed", "data_root", "download", "save_local_models", "tracking", "eval_local"})
CL_IGNORED = IGNORED | {"algo", "algo_args", "participation"}  # a centralised run has no federation


class Entry(NamedTuple):
    config: Any  # a FederateConfig, or any object with its attributes
    acc: float  # final test_acc, a fraction
    name: str = ""  # the run's name, for the JSON
    recorded: dict | None = None  # config.json's inputs beside the config: init_sha256, algo (resolved)


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
    """A config's settings by name, the partitions' and datasets' among them (FederateConfig keeps those
    apart)."""
    values = cfg.settings()
    partition, data = values.pop("partition_args", {}), values.pop("data_args", {})
    return {**values, **partition, **data}


def _moot(partition: str) -> set[str]:
    """The partition settings a partition does not use (alpha for iid); none for one not registered."""
    cls = PARTITIONS.get(partition)
    if cls is None:
        return set()
    return set(setting_fields()) - {f.name for f in dataclasses.fields(cls.Config)}


def _dotted(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys (``algo.mu``); lists as tuples (hashable)."""
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


def inputs_of(entry: Entry, ignored: frozenset[str], init: bool = False) -> dict[str, Any]:
    """What a run was made from, as far as it is recorded: its settings but ``ignored`` ones, whether it is
    centralised (a column's own key) and the partition settings its partition does not use; the sha256 of
    its --init file and, unless ``algo`` is ignored, the resolved algorithm settings (``algo.NAME``).
    ``init``: also the --init path where no sha256 is recorded (a report's rows are inits already; a paper
    row may map several to one)."""
    fields, recorded = _flat(entry.config), entry.recorded or {}
    skip = ignored | {"centralized"} | _moot(fields.get("partition", ""))
    skip |= {"init"} if "init_sha256" in recorded or not init else set()
    values = {k: v for k, v in fields.items() if k not in skip}
    if "init_sha256" in recorded:
        values["init_sha256"] = recorded["init_sha256"]
    if "algo" not in ignored and isinstance(recorded.get("algo"), dict):
        values["algo"] = recorded["algo"]
    return _dotted(values)


UNRECORDED = object()  # an input a run's record does not have (a run from before it was recorded)


def differing(inputs: list[dict[str, Any]], absent: bool = False) -> list[str]:
    """The keys with two or more values among the ``inputs`` that have them; ``absent``: a key that some
    lack counts as another value (:data:`UNRECORDED`)."""
    keys = dict.fromkeys(k for i in inputs for k in i)
    if absent:
        return [k for k in keys if len({repr(i.get(k, UNRECORDED)) for i in inputs}) > 1]
    return [k for k in keys if len({repr(i[k]) for i in inputs if k in i}) > 1]


def input_text(key: str, value: Any) -> str:
    """One input for a row label: ``lr 0.01``, ``init sha256 3f2a9c1e0b7d`` (its first 12 hex digits)."""
    if key == "init_sha256":
        return f"init sha256 {value[:12] if isinstance(value, str) else 'unrecorded'}"
    if value is UNRECORDED:
        return f"{key} unrecorded"
    if isinstance(value, float):
        return f"{key} {value:g}"
    return f"{key} {'none' if value is None else value}"


def pool_notes(cell: Cell, where: str) -> list[str]:
    """Warnings about a cell that pools more than seeds: repeated seeds (its runs' inputs, :func:`inputs_of`,
    are the same: the rows are split by them, or :func:`check_pooled` refuses the cell)."""
    seeds = [e.config.seed for e in cell.entries]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    return [f"{where} has several runs with seed {', '.join(map(str, repeated))}"] if repeated else []


def check_pooled(cell: Cell, ignored: frozenset[str], where: str) -> None:
    """Refuse (one line) a cell whose runs were made from different inputs, or whose records leave that
    open (one records an input, another not): never one mean of them."""
    inputs = [inputs_of(e, ignored, init=True) for e in cell.entries]
    keys = differing(inputs, absent=True)
    if not keys:
        return
    key = keys[0]
    value = [i.get(key, UNRECORDED) for i in inputs]
    other = next(j for j, v in enumerate(value) if repr(v) != repr(value[0]))
    runs = " and ".join(f"{cell.entries[j].name or 'a run'} ({input_text(key, value[j])})"
                        for j in (0, other))
    raise AnalysisError(f"{where} would pool runs made from different inputs ({', '.join(keys)} differ: "
                        f"{runs}); a cell pools the seeds of one setting: leave out the runs of the other")
