"""A model called on explicit tensors, and the small tree helpers the client hooks share.

An algorithm writes its local terms once, as pure functions of parameter and buffer dicts
(:meth:`federated.algorithms.FedAvg.functional_loss`); the one-client loop (:mod:`federated.local`) calls them
with the model's own tensors, the vectorised loop (:mod:`federated.batched`) with stacked ones under
``vmap``. Both call the model through :class:`FunctionalModel`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

State = dict[str, Tensor]


class FunctionalModel:
    """``model`` called on explicit tensors: ``fm(params, buffers, x)`` in training mode (BatchNorm statistics
    updated in place), ``fm.frozen(state, x)`` in eval mode, ``with_z=True`` for (z, logits). ``fm.params``
    and ``fm.buffers`` are the model's own tensors (what the one-client loop trains)."""

    def __init__(self, model: nn.Module, task: Any):
        self.train_model = model
        self.task = task
        self.params: State = dict(model.named_parameters())
        self.buffers: State = dict(model.named_buffers())
        self._eval_model: nn.Module | None = None  # made on first use: only MOON reads other models

    def __call__(self, params: State, buffers: State, x: Tensor, with_z: bool = False):
        kwargs = {"with_z": True} if with_z else {}
        if params is self.params and buffers is self.buffers:  # the model's own tensors: no swap needed
            return self.train_model(x, **kwargs)
        return functional_call(self.train_model, (params, buffers), (x,), kwargs)

    def frozen(self, state: State, x: Tensor, with_z: bool = False):
        if self._eval_model is None:
            self._eval_model = copy.deepcopy(self.train_model).eval()
        return functional_call(self._eval_model, state, (x,), {"with_z": True} if with_z else {})


def tree_stack(trees: list[Any]) -> Any:
    """The leaves of equally shaped nested dicts stacked along a new leading (client) axis."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: tree_stack([t[k] for t in trees]) for k in first}
    return torch.stack(trees) if isinstance(first, Tensor) else first


def tree_to(tree: Any, device: torch.device) -> Any:
    """Every tensor of a nested dict on ``device`` (tensors already there are the same objects)."""
    if isinstance(tree, dict):
        return {k: tree_to(v, device) for k, v in tree.items()}
    return tree.to(device) if isinstance(tree, Tensor) else tree
