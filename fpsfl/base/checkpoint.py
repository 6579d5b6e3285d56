"""The backbone checkpoint contract shared by ``pretrain`` (writer) and ``federate`` (reader).

A checkpoint is one ``torch.save`` file holding a dict of tensors and plain Python types only::

    {"format": "fpsfl-backbone/1", "arch": str, "width": float, "method": str, "source": str,
     "epoch": int, "config": dict, "backbone": state_dict}

so it loads with ``torch.load(path, weights_only=True)``: opening a checkpoint never runs code. A file that
does not load that way, or lacks a field, is refused with :class:`CheckpointError`. Files are written
atomically (:mod:`fpsfl.base.files`), so a crash never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .files import atomic_save, atomic_write  # noqa: F401 (the writers import them from here)

FORMAT = "fpsfl-backbone/1"
_FIELDS = {"arch": str, "width": (int, float), "method": str, "source": str, "epoch": int, "config": dict,
           "backbone": dict}


class CheckpointError(ValueError):
    """A file that is not a usable fpsfl backbone checkpoint; the message is one line."""


def plain(value: Any) -> Any:
    """``value`` with tuples turned into lists, recursively: what a JSON config round-trip gives back."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


UNSET = "(unset)"  # how :func:`differences` shows a key one side lacks


def differences(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for each key whose values differ, sorted, a table's own keys named
    inside it (``algo_args.mu``); a key one side lacks has :data:`UNSET` there. For a refused --resume to
    name what changed."""
    out = []
    for key in sorted(old.keys() | new.keys()):
        x, y = old.get(key, UNSET), new.get(key, UNSET)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [(f"{key}.{k}", a, b) for k, a, b in differences(x, y)]
        elif x != y:
            out.append((key, x, y))
    return out


def make_checkpoint(backbone: nn.Module, *, arch: str, width: float, method: str, source: str, epoch: int,
                    config: dict) -> dict:
    """The checkpoint dict of ``backbone`` (tensors detached and moved to CPU)."""
    state = {k: v.detach().cpu().clone() for k, v in backbone.state_dict().items()}
    return {"format": FORMAT, "arch": arch, "width": float(width), "method": method, "source": source,
            "epoch": int(epoch), "config": plain(config), "backbone": state}


def save_checkpoint(ckpt: dict, path: str | Path) -> None:
    validate(ckpt, str(path))
    atomic_save(ckpt, path)


def validate(ckpt: Any, where: str) -> dict:
    """Check the contract's fields and types; returns ``ckpt``."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{where} is not an fpsfl backbone checkpoint (format {found!r}, "
                              f"expected {FORMAT!r})")
    for field, types in _FIELDS.items():
        if not isinstance(ckpt.get(field), types):
            raise CheckpointError(f"{where}: checkpoint field {field!r} is missing or has the wrong type")
    if not all(isinstance(v, torch.Tensor) for v in ckpt["backbone"].values()):
        raise CheckpointError(f"{where}: checkpoint 'backbone' must map names to tensors")
    return ckpt


def _culprit(exc: BaseException) -> str:
    """The 'Unsupported global: ...' part of torch's long weights-only error, if it has one."""
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
    return found.group(1) if found else ""


def load_weights_only(path: str | Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; any failure is one ``error`` line naming the file
    and ``what`` it should be: a missing, truncated or corrupt file, or one whose pickle needs more than
    tensors and plain types (never unpickled: no code runs)."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickles before refusing them
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # every failure to read a file the user gave is a problem with that file
        culprit = _culprit(exc)
        if culprit or isinstance(exc, pickle.UnpicklingError):
            holds = f" (it holds {culprit})" if culprit else ""
            raise error(f"{path} is not a valid {what}: it needs more than tensors and plain Python types to "
                        f"load{holds}; refusing to unpickle it") from None
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise error(f"{path} is not a valid {what}: it does not load (truncated or corrupt? "
                    f"{detail})") from None


def load_checkpoint(path: str | Path) -> dict:
    """Load and validate a checkpoint with ``weights_only=True`` (no code runs); CheckpointError otherwise."""
    return validate(load_weights_only(path, "checkpoint", CheckpointError), str(path))


def load_backbone_weights(backbone: nn.Module, ckpt: dict, where: str = "checkpoint") -> list[str]:
    """Load ``ckpt["backbone"]`` into ``backbone`` strictly; returns the loaded tensor names."""
    own, theirs = backbone.state_dict(), ckpt["backbone"]
    missing, unexpected = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{where} does not fit arch {ckpt['arch']!r}: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    for name, tensor in theirs.items():
        if tensor.shape != own[name].shape:
            raise CheckpointError(
                f"{where}: tensor {name} has shape {tuple(tensor.shape)} in the file but "
                f"{tuple(own[name].shape)} in a {ckpt['arch']} of width {ckpt['width']:g} (the width its "
                f"header states); the header does not match the tensors")
    backbone.load_state_dict(theirs)
    return list(theirs)
