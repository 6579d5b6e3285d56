"""Local training of one client (or of the centralised baseline) with an algorithm's hooks.

Chen et al., ICLR 2023, §4.2 / Appendix B.1: SGD with momentum 0.9 and weight decay 1e-4 for E local
epochs over the client's data in mini-batches. Data sit on the training device as uint8; each batch is
indexed, augmented and normalised there (:mod:`federated.tasks`); streamed datasets (iNat-GEO) are decoded
batch by batch ahead of use (:mod:`federated.datasets.stream`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fpsfl.base.device import compile_backend

from .algorithms import ClientContext, FedAvg
from .datasets.stream import fetch, on_device
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


def compile_model(model: nn.Module, device: torch.device) -> nn.Module:
    """``federate --compile`` (issue 40): ``model``'s forward, and through AOTAutograd its backward, compiled
    in place by torch.compile (``nn.Module.compile``: the same module, parameters and state-dict names, so a
    client's start state loads into it as into the eager model, and a deep copy of it is eager again). The
    algorithm's loss terms and the optimiser step stay eager. Shapes are static until a client's short
    last batch, whose recompilation makes the batch dimension dynamic: two or three graphs for a run. On
    CUDA cuDNN then times each convolution's algorithms once per shape (:func:`compile_backend`)."""
    model.compile(backend=compile_backend(device))
    return model


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
    # a rare step, run eagerly under --compile: no graphs traced for its hooks (set_stance: torch >= 2.6)
    stance = getattr(torch.compiler, "set_stance", None)
    with stance("force_eager") if stance is not None else nullcontext(), _switching(model):
        yield


@contextmanager
def _switching(model: nn.Module) -> Iterator[None]:
    """:func:`one_value_batchnorm`'s hooks: eval mode for the calls of a BatchNorm that sees one value."""
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


def check_interval(device: torch.device) -> int:
    """Steps between reads of the running loss: :data:`CHECK_EVERY` on a CPU, where a read waits for
    nothing; 0 (once, after the last step) on an accelerator, where every read stalls the queue (issue 40)."""
    return CHECK_EVERY if device.type == "cpu" else 0


def local_train(model: nn.Module, optimizer: torch.optim.Optimizer, algo: FedAvg, ctx: ClientContext,
                task: Task, x: Tensor, y: Tensor, batches: list[Tensor], aug_gen: torch.Generator,
                noise: float = 0.0, check_every: int | None = None) -> float:
    """Train ``model`` in place, one step per entry of ``batches`` (sample indices into (x, y), see
    :func:`epoch_batches`); returns the mean training loss. Augmentation is drawn from ``aug_gen``. The
    loss is summed on the device and read every ``check_every`` steps (0: after the last; None: the device's
    :func:`check_interval`), so a step itself never waits for the device."""
    model.train()
    check_every = check_interval(y.device) if check_every is None else check_every
    total, count = torch.zeros((), device=x.device), 0
    labels = on_device(batches, y.device)  # one copy for all steps
    for batch, index, images in zip(batches, labels, fetch(x, batches), strict=True):  # streamed: ahead
        inputs, targets = task.train_inputs(images, y[index], aug_gen, noise)
        with one_value_batchnorm(model, on=len(batch) == 1):
            loss = algo.local_loss(ctx, model, task, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        algo.before_step(ctx, model)
        optimizer.step()
        ctx.steps += 1
        total += loss.detach().float()
        count += 1
        if check_every and count % check_every == 0:
            _check_finite(total, ctx.client)
    return _check_finite(total, ctx.client) / max(count, 1)


def _check_finite(total: Tensor, client: int) -> float:
    """The summed loss, read from the device; a DivergenceError when it is not finite."""
    value = total.item()
    if not math.isfinite(value):
        raise DivergenceError(f"client {client}: the local loss became {value}")
    return value
