"""Our nested dicts of tensors and scalars as Flower records, and back (Flower's Message API, flwr >= 1.20).

Model states travel as an ArrayRecord (:func:`state_record`, read by :func:`read_state`) in one of two
forms. Between our ServerApp and our ClientApp, *packed*: every tensor's bytes in one uint8 array
(``fpsfl.bytes``) and their names, dtypes and shapes in another (``fpsfl.layout``, JSON). Flower stores and
forwards a message as one object per array (and per 5 MB chunk), each its own request at the SuperLink,
the SuperNode and the executor; a ResNet20's 116 tensors made about 60 objects a message, and on the 2-vCPU
VM the SuperLink spent about 30 CPU-seconds a round of 10 clients on them (issue 33). Packed, a model is 2
objects. Flower's own form, ``ArrayRecord(state_dict)`` / ``to_torch_state_dict()``, serves Flower's
strategies (``flwr.serverapp.strategy.FedAvg`` averages arrays by key): a client replies in the form it
was sent.

A client's algorithm state (``algo.clients[i]``: SCAFFOLD's control variate, MOON's previous model,
FedIR's weights, the client's own BatchNorm statistics under --bn local), a client step's payload
(``extra``) and the algorithm's server state are nested dicts of tensors and scalars. :func:`put_tree`
stores one under a name as two records: ``NAME`` (a ConfigRecord holding the tree's structure as JSON) and
``NAME.arrays`` (its tensors, packed); :func:`get_tree` rebuilds it. Values and dtypes come back bit for bit.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

SCALARS = (bool, int, float, str, type(None))


LAYOUT, BYTES = "fpsfl.layout", "fpsfl.bytes"  # the two arrays of a packed state
EXTRA = "fpsfl.extra"  # the tree of a client step's payload, beside the reply's model state


def state_record(state: dict[str, torch.Tensor], packed: bool = True) -> ArrayRecord:
    """``state`` (names to tensors) as an ArrayRecord: packed (two arrays), or Flower's one array per name."""
    if not packed:
        return ArrayRecord({k: v.detach().cpu() for k, v in state.items()})
    layout, parts = [], []
    for name, tensor in state.items():
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        layout.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), raw.numel()])
        parts.append(raw)
    blob = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    text = torch.frombuffer(bytearray(json.dumps(layout).encode()), dtype=torch.uint8)
    return ArrayRecord({LAYOUT: _array(text), BYTES: _array(blob)})


def is_packed(record: ArrayRecord) -> bool:
    return LAYOUT in record


def read_state(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of an ArrayRecord in either form, on ``device``. A packed record whose layout does not
    describe its bytes exactly (another process wrote it: a bug, a fault or intent) is a ValueError."""
    if not is_packed(record):
        return {k: v.to(device) for k, v in record.to_torch_state_dict().items()}
    blob = torch.from_numpy(record[BYTES].numpy()).reshape(-1)
    try:
        layout = json.loads(bytes(record[LAYOUT].numpy().tobytes()).decode())
    except (UnicodeDecodeError, ValueError):
        raise ValueError("the layout of its packed arrays is not JSON") from None
    if blob.dtype != torch.uint8 or not isinstance(layout, list):
        raise ValueError("its packed arrays are not bytes and a layout")
    state, offset = {}, 0
    for entry in layout:
        name, dtype, shape, size = _entry(entry)
        if offset + size > blob.numel():
            raise ValueError(f"its packed array {name!r} runs past the bytes")
        state[name] = blob[offset:offset + size].clone().view(dtype).reshape(shape).to(device)
        offset += size
    if offset != blob.numel() or len(state) != len(layout):
        raise ValueError("its packed bytes are not the layout's (extra bytes or a repeated name)")
    return state


def _entry(entry: Any) -> tuple[str, torch.dtype, list[int], int]:
    """One layout entry, checked: a name, a tensor dtype, a shape and its size in bytes."""
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
            and isinstance(entry[2], list) and all(type(d) is int and d >= 0 for d in entry[2])
            and type(entry[3]) is int):
        raise ValueError(f"its packed layout entry {str(entry)[:80]} is not [name, dtype, shape, bytes]")
    name, dtype_name, shape, size = entry
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"its packed array {name!r} has no tensor dtype ({str(dtype_name)[:40]})")
    if math.prod(shape) * dtype.itemsize != size:
        raise ValueError(f"its packed array {name!r}: shape {shape} of {dtype_name} is not {size} bytes")
    return name, dtype, shape, size


def put_tree(records: RecordDict, name: str, tree: Any) -> None:
    """Store ``tree`` (dicts with str keys, tensors, scalars) in ``records`` under ``name``."""
    tensors: dict[str, torch.Tensor] = {}

    def encode(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            key = str(len(tensors))
            tensors[key] = value
            return {"t": key}
        if isinstance(value, dict):
            return {"d": {_key(k, path): encode(v, f"{path}/{k}") for k, v in value.items()}}
        if isinstance(value, SCALARS):
            return {"v": value}
        raise TypeError(f"{path}: a {type(value).__name__} cannot travel in a Flower message")

    structure = encode(tree, name)
    records[name] = ConfigRecord({"tree": json.dumps(structure)})
    records[f"{name}.arrays"] = state_record(tensors)


def get_tree(records: RecordDict, name: str, device: torch.device | str = "cpu") -> Any:
    """The tree :func:`put_tree` stored under ``name``, its tensors on ``device``."""
    tensors = read_state(records[f"{name}.arrays"], device)

    def decode(node: dict) -> Any:
        if "t" in node:
            return tensors[node["t"]]
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


def read_update(content: RecordDict, device: torch.device | str = "cpu") -> tuple[dict, Any]:
    """A client's reply: its model state (``arrays``, either form) and its payload (:data:`EXTRA`, ``{}``
    without one), on ``device``. A malformed reply raises what :func:`read_state` and :func:`get_tree` do."""
    state = read_state(content["arrays"], device)
    return state, get_tree(content, EXTRA, device) if has_tree(content, EXTRA) else {}
