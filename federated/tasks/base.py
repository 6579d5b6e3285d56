"""What a federated task is to the round loop: model head, loss, metric and augmentation.

Chen et al., ICLR 2023 study image classification (§4.2-4.4) and Cityscapes segmentation (§4.5). The round
loop and the algorithms only talk to a :class:`Task`, so a segmentation task plugs in by implementing the
same few methods. Per-sample losses (shape (B,)) let algorithms such as FedIR reweight samples.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn


class Task(Protocol):
    n_classes: int
    provides: frozenset[str]  # capabilities algorithms may require: "features", "sample_labels"

    def build_model(self, backbone: nn.Module) -> nn.Module: ...

    def train_inputs(self, x: Tensor, y: Tensor, generator: torch.Generator,
                     noise: float) -> tuple[Tensor, Tensor]: ...

    def eval_inputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]: ...

    def loss(self, output: Tensor, target: Tensor) -> Tensor: ...  # per sample, (B,)

    def sample_labels(self, y: Tensor) -> Tensor: ...  # one class per sample (N,), for label-skew partitions

    def class_counts(self, y: Tensor) -> Tensor: ...  # (C,) counts over the samples, for reports and FedIR

    def evaluate(self, model: nn.Module, x: Tensor, y: Tensor) -> dict: ...  # "acc" (main metric), "loss"
