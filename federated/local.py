"""Local training of one client (or of the centralised baseline) with an algorithm's hooks.

Chen et al., ICLR 2023, §4.2 / Appendix B.1: SGD with momentum 0.9 and weight decay 1e-4 for E local
epochs over the client's data in mini-batches. Data sit on the training device as uint8; each batch is
indexed, augmented and normalised there (:mod:`federated.tasks`); streamed datasets (iNat-GEO) are decoded
batch by batch ahead of use (:mod:`federated.datasets.stream`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

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
    drawn from ``order_gen`` (CPU), cut into batches. A batch of one sample is dropped (BatchNorm cannot
    train on it)."""
    batches = []
    for pool in pools:
        order = pool[torch.randperm(len(pool), generator=order_gen)]
        batches += [batch for batch in order.split(batch_size) if len(batch) >= 2]
    return batches


def local_train(model: nn.Module, optimizer: torch.optim.Optimizer, algo: FedAvg, ctx: ClientContext,
                task: Task, x: Tensor, y: Tensor, batches: list[Tensor], aug_gen: torch.Generator,
                noise: float = 0.0) -> float:
    """Train ``model`` in place, one step per entry of ``batches`` (sample indices into (x, y), see
    :func:`epoch_batches`); returns the mean training loss. Augmentation is drawn from ``aug_gen``."""
    model.train()
    total, count = torch.zeros((), device=x.device), 0
    for batch, images in zip(batches, fetch(x, batches), strict=True):  # streamed images: decoded ahead
        inputs, targets = task.train_inputs(images, y[batch.to(y.device)], aug_gen, noise)
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
