"""Our nested dicts of tensors and scalars as Flower records, and back (Flower's Message API, flwr >= 1.20).

Model state dicts travel as Flower's own ``ArrayRecord(state_dict)`` / ``to_torch_state_dict()``. A client's
algorithm state (``algo.clients[i]``: SCAFFOLD's control variate, MOON's previous model, FedIR's
weights, the client's own BatchNorm statistics under --bn local), a client step's payload (``extra``) and
the algorithm's server state are nested dicts of tensors and scalars. :func:`put_tree` stores one under a
name as two records: ``NAME`` (a ConfigRecord holding the tree's structure as JSON) and ``NAME.arrays`` (an
ArrayRecord of its tensors); :func:`get_tree` rebuilds it. Tensors travel as NumPy arrays (np.save), so
values and dtypes come back bit for bit.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

SCALARS = (bool, int, float, str, type(None))


def put_tree(records: RecordDict, name: str, tree: Any) -> None:
    """Store ``tree`` (dicts with str keys, tensors, scalars) in ``records`` under ``name``."""
    arrays = ArrayRecord()

    def encode(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            key = str(len(arrays))
            arrays[key] = _array(value)
            return {"t": key}
        if isinstance(value, dict):
            return {"d": {_key(k, path): encode(v, f"{path}/{k}") for k, v in value.items()}}
        if isinstance(value, SCALARS):
            return {"v": value}
        raise TypeError(f"{path}: a {type(value).__name__} cannot travel in a Flower message")

    structure = encode(tree, name)
    records[name] = ConfigRecord({"tree": json.dumps(structure)})
    records[f"{name}.arrays"] = arrays


def get_tree(records: RecordDict, name: str, device: torch.device | str = "cpu") -> Any:
    """The tree :func:`put_tree` stored under ``name``, its tensors on ``device``."""
    arrays = records[f"{name}.arrays"]

    def decode(node: dict) -> Any:
        if "t" in node:
            return torch.from_numpy(arrays[node["t"]].numpy()).to(device)
        if "d" in node:
            return {k: decode(v) for k, v in node["d"].items()}
        return node["v"]

    return decode(json.loads(records[name]["tree"]))


def has_tree(records: RecordDict, name: str) -> bool:
    return name in records and f"{name}.arrays" in records


def drop_tree(records: RecordDict, name: str) -> None:
    """Remove the tree stored under ``name`` (if any)."""
    for key in (name, f"{name}.arrays"):
        if key in records:
            del records[key]


def tree_names(records: RecordDict, prefix: str) -> list[str]:
    """The names of the trees stored in ``records`` whose name starts with ``prefix``."""
    return sorted(k for k in records if k.startswith(prefix) and has_tree(records, k))


def _array(tensor: torch.Tensor) -> Array:
    return Array.from_torch_tensor(tensor.detach())


def _key(key: Any, path: str) -> str:
    if not isinstance(key, str):  # JSON keys are strings: an int key would come back as another key
        raise TypeError(f"{path}: key {key!r} is not a str; it cannot travel in a Flower message")
    return key
