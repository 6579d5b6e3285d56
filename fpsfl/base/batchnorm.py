"""Re-estimating BatchNorm running statistics on given data (shared by the analyses of Chen et al., ICLR
2023, §6, and the fair probe of pre-trained backbones, issue 38)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

BATCHNORM = nn.modules.batchnorm._BatchNorm


@torch.no_grad()
def recompute_bn(model: nn.Module, batches: Callable[[], Iterable[Tensor]], bn_only: bool = False) -> None:
    """Reset every BatchNorm's running statistics and re-estimate them as a plain average over ``batches``
    (model inputs, already preprocessed), leaving the model in eval mode. The pass runs the whole model in
    train mode, or with ``bn_only`` only its BatchNorm layers (dropout and the like stay off)."""
    layers = [m for m in model.modules() if isinstance(m, BATCHNORM)]
    if not layers:
        return
    saved = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: every batch counts equally
    model.train(not bn_only)
    for m in layers:
        m.train()
    for inputs in batches():
        model(inputs)
    for m, momentum in zip(layers, saved, strict=True):
        m.momentum = momentum
    model.eval()
