"""Image classification (Chen et al., ICLR 2023, §4.2-4.4): a linear head on pooled backbone features,
cross-entropy, top-1 accuracy, and pad-crop + flip (32 px) or random-resized-crop + flip augmentation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.images import eval_batch

from ..datasets.stream import chunks
from . import TASKS
from .base import Task
from .transforms import TrainAugment, add_noise, augment_batch


class Classifier(nn.Module):
    """A backbone (pooled features h), a projector (identity unless an algorithm installs one: MOON's
    head, whose output z the classifier then reads) and a linear head."""

    def __init__(self, backbone: nn.Module, n_classes: int):
        super().__init__()
        self.backbone = backbone
        self.projector = nn.Identity()
        self.head = nn.Linear(backbone.feature_dim, n_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.backbone(x)

    def forward(self, x: Tensor, with_z: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits; with ``with_z`` (z, logits), z the representation the head reads (for MOON)."""
        z = self.projector(self.backbone(x))
        return (z, self.head(z)) if with_z else self.head(z)


class ClassificationTask:
    """Cross-entropy and top-1 accuracy; pad-crop + flip at 32 px, random-resized-crop + flip above."""

    provides = frozenset({"features", "sample_labels", "functional"})  # functional: --client-batch

    def __init__(self, n_classes: int, input_size: int, hflip: bool = True):
        self.n_classes = n_classes
        self.augment = TrainAugment(input_size=input_size, flip_p=0.5 if hflip else 0.0)

    def build_model(self, backbone: nn.Module) -> nn.Module:
        return Classifier(backbone, self.n_classes)

    def train_inputs(self, x: Tensor, y: Tensor, generator: torch.Generator,
                     noise: float) -> tuple[Tensor, Tensor]:
        inputs = augment_batch(x, self.augment, generator)
        if noise > 0:
            inputs = add_noise(inputs, noise, generator, self.augment.std)
        return inputs, y

    def eval_inputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return eval_batch(x, self.augment.input_size, self.augment.mean, self.augment.std), y

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output.float(), target, reduction="none")

    def sample_labels(self, y: Tensor) -> Tensor:
        return y

    def class_counts(self, y: Tensor) -> Tensor:
        return torch.bincount(y, minlength=self.n_classes)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 512) -> dict[str, float]:
        """Mean loss and top-1 accuracy of ``model`` on (x, y), in eval mode (BatchNorm running stats)."""
        was_training = model.training
        model.eval()
        loss = correct = 0.0
        for images, labels in chunks(x, y, batch_size):  # streamed images: decoded ahead
            inputs, target = self.eval_inputs(images, labels)
            out = model(inputs)
            loss += self.loss(out, target).sum().item()
            correct += (out.argmax(1) == target).sum().item()
        model.train(was_training)
        n = max(len(x), 1)
        return {"loss": loss / n, "acc": correct / n}


@TASKS.register(name="classification")
def classification(data, cfg) -> Task:
    """The task of a classification dataset (``ImageData``) under a ``FederateConfig``."""
    return ClassificationTask(data.n_classes, cfg.input_size or data.input_size, data.hflip)
