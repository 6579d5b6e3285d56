"""Local training of one client (or of the centralised baseline) with an algorithm's hooks.

Chen et al., ICLR 2023, §4.2 / Appendix B.1: SGD with momentum 0.9 and weight decay 1e-4 for E local
epochs over the client's data in mini-batches. Data sit on the training device as uint8; each batch is
indexed, augmented and normalised there (:mod:`federated.tasks`); streamed datasets (iNat-GEO) are decoded
batch by batch ahead of use (:mod:`federated.datasets.stream`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from .algorithms import ClientContext, FedAvg
from .datasets.stream import fetch
from .tasks import Task

CHECK_EVERY = 8  # steps between finiteness checks (each synchronises a GPU; NaN arithmetic is slow on CPU)


class DivergenceError(RuntimeError):
    """The loss became NaN or inf; the message says where."""


def make_optimizer(model: nn.Module, name: str, lr: float, momentum: float,
                   weight_decay: float) -> torch.optim.Optimizer:
    """SGD with momentum (classification, Appendix B.1) or Adam (Cityscapes, Table 9)."""
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def epoch_batches(pools: list[Tensor], batch_size: int, order_gen: torch.Generator) -> list[Tensor]:
    """The sample indices of every local step: one local epoch per entry of ``pools``, each in an order
    drawn from ``order_gen`` (CPU), cut into batches. A last batch of one sample is dropped when the epoch
    has larger ones (its sample comes in another epoch's order); an epoch of one-sample batches (a client
    of one sample, or ``--batch-size 1``) keeps them (see :func:`one_value_batchnorm`)."""
    batches = []
    for pool in pools:
        order = pool[torch.randperm(len(pool), generator=order_gen)]
        split = order.split(batch_size)
        singles = bool(split) and len(split[0]) == 1  # every batch has one sample
        batches += [batch for batch in split if len(batch) >= 2 or singles]
    return batches


@contextmanager
def one_value_batchnorm(model: nn.Module, on: bool = True) -> Iterator[None]:
    """While ``on``, a BatchNorm layer that sees one value per channel normalises that input with its running
    statistics (eval mode, for that call only), as train mode cannot; every other layer trains as usual.
    How a one-sample batch trains: its layers normalise over the sample's positions, except those after a
    1x1 feature map (ResNet18 or MobileNetV2 at 32 px), whose input the earlier layers already normalised.
    A whole model in eval mode would not do: a random init's running statistics (0 and 1) normalise
    nothing, and on digits the loss became NaN within the first steps."""
    if not on:
        yield
        return
    switched: set[nn.Module] = set()

    def before(layer: nn.Module, args: tuple) -> None:
        x = args[0]
        if layer.training and x.numel() == x.shape[1]:
            layer.training = False
            switched.add(layer)

    def after(layer: nn.Module, args: tuple, output: Tensor) -> None:
        if layer in switched:
            switched.discard(layer)
            layer.training = True
    hooks = [hook for m in model.modules() if isinstance(m, _BatchNorm)
             for hook in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def local_train(model: nn.Module, optimizer: torch.optim.Optimizer, algo: FedAvg, ctx: ClientContext,
                task: Task, x: Tensor, y: Tensor, batches: list[Tensor], aug_gen: torch.Generator,
                noise: float = 0.0) -> float:
    """Train ``model`` in place, one step per entry of ``batches`` (sample indices into (x, y), see
    :func:`epoch_batches`); returns the mean training loss. Augmentation is drawn from ``aug_gen``."""
    model.train()
    total, count = torch.zeros((), device=x.device), 0
    for batch, images in zip(batches, fetch(x, batches), strict=True):  # streamed images: decoded ahead
        inputs, targets = task.train_inputs(images, y[batch.to(y.device)], aug_gen, noise)
        with one_value_batchnorm(model, on=len(batch) == 1):
            loss = algo.local_loss(ctx, model, task, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        algo.before_step(ctx, model)
        optimizer.step()
        ctx.steps += 1
        total += loss.detach().float()
        count += 1
        if count % CHECK_EVERY == 0:
            _check_finite(total, ctx.client)
    _check_finite(total, ctx.client)
    return total.item() / max(count, 1)


def _check_finite(total: Tensor, client: int) -> None:
    value = total.item()
    if not math.isfinite(value):
        raise DivergenceError(f"client {client}: the local loss became {value}")
