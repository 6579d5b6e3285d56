"""Counting the calls that make the host wait for the device (issue 40), on any device, CPU included.

On a GPU, a training step that reads a value back (``.item()``, ``.tolist()``, ``bool(t)``), asks for an
output whose shape depends on the data (``nonzero``, boolean-mask indexing), or copies from host memory
(``torch.tensor(list)`` on a device, ``.to(device)``, ``new_tensor``) stalls the host until the device has
finished all queued work; a step with none keeps the device's queue full. CUDA's sync debug mode finds
them on a GPU only; :class:`SyncCounter` counts the same calls on the CPU, where the tests run, by watching
the torch functions a step calls (:class:`torch.overrides.TorchFunctionMode`). It counts call sites, not
whether a given call would block on a given device: a ``.to()`` that is a no-op on the CPU counts, because
on a GPU it is a host-to-device copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

# Tensor methods that return host values or host copies
_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}
# functions whose output shape depends on the values (the host must read a count back)
_SHAPES = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}


def _name(func) -> str:
    return getattr(func, "__name__", "") or str(func)


def _host_data(args: tuple) -> bool:
    """Whether a tensor constructor got Python or numpy data (not a tensor already in place)."""
    return bool(args) and not isinstance(args[0], Tensor)


def _tensor_repeats(args: tuple, kwargs: dict) -> bool:
    """``repeat_interleave`` with a tensor of counts (its output length depends on their values)."""
    repeats = kwargs.get("repeats", args[1] if len(args) > 1 else args[0] if args else None)
    return isinstance(repeats, Tensor) and repeats.numel() > 1


def _boolean_index(args: tuple) -> bool:
    key = args[1] if len(args) > 1 else None
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, Tensor) and k.dtype == torch.bool for k in keys)


class SyncCounter(TorchFunctionMode):
    """``with SyncCounter() as c: step()``; then ``c.total`` and ``c.calls`` (a Counter by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in _READS or name in _SHAPES:
            self.calls[name] += 1
        elif name == "repeat_interleave" and _tensor_repeats(args, kwargs):
            self.calls[name] += 1
        elif name == "new_tensor" and _host_data(args[1:]):  # host data onto the source's device
            self.calls[name] += 1
        elif name in ("tensor", "as_tensor") and _host_data(args) and kwargs.get("device") is not None:
            self.calls[name] += 1  # host data onto a named device (without one: a host tensor, no copy)
        elif name in ("to", "cuda", "copy_") and _moves_device(name, args, kwargs):
            self.calls[name] += 1
        elif name == "__getitem__" and _boolean_index(args):
            self.calls["bool-index"] += 1
        elif name == "where" and len(args) + len(kwargs) == 1:
            self.calls["where(cond)"] += 1
        return func(*args, **kwargs)


def _moves_device(name: str, args: tuple, kwargs: dict) -> bool:
    """``t.to(device)`` / ``t.cuda()``: an explicit move, counted whatever the devices (on the CPU it is a
    no-op, on a GPU a host-to-device copy when ``t`` came from the host); ``t.to(other)`` and
    ``dst.copy_(src)`` only when the two tensors' devices differ; ``t.to(dtype)`` never."""
    if name == "cuda":
        return True
    if name == "copy_":
        return len(args) > 1 and isinstance(args[1], Tensor) and args[1].device != args[0].device
    for target in (*args[1:], kwargs.get("device")):
        if isinstance(target, Tensor) and target.device != args[0].device:
            return True
        if isinstance(target, (torch.device, str)):
            return True
    return False


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """``t`` on ``device``, moved only when it lies elsewhere. An explicit ``.to(device)`` in a step counts as
    a sync (:class:`SyncCounter` cannot tell on the CPU where a tensor would lie on a GPU), so a move meant
    only across devices goes through here and says so."""
    return t if t.device == torch.device(device) else t.to(device)


_CONSTANTS: dict[tuple, Tensor] = {}


def _device_constant(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    key = (values, device, dtype)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(values, dtype=dtype, device=device)
    return _CONSTANTS[key]


def device_constant(values: Sequence[float], device: torch.device, dtype: torch.dtype) -> Tensor:
    """``values`` as a 1-D tensor on ``device``, made once per device and dtype: copied from the host every
    batch, it would make each step wait for the device (issue 40). Never written to. Made before torch.compile
    traces a graph that uses it, it is one of the graph's inputs; made while tracing, the graph would make
    it again at every call (``pretrain.compiled`` makes the augmentation's first)."""
    return _device_constant(tuple(float(v) for v in values), torch.device(device), dtype)


def channel_constant(values: Sequence[float], device: torch.device, dtype: torch.dtype) -> Tensor:
    """:func:`device_constant` as (1, C, 1, 1), to broadcast over a (B, C, H, W) batch."""
    return device_constant(values, device, dtype).view(1, -1, 1, 1)
