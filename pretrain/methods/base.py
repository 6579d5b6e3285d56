"""The interface every pre-training method implements (Chen et al., ICLR 2023, §4.2 and Appendix A.2).

A method wraps a backbone with whatever heads it needs and turns a batch of augmented views into a loss.
The training loop (:mod:`pretrain.train`) knows nothing else about it: it asks for the optimiser's parameter
groups, calls the method on each batch, steps the optimiser, then calls :meth:`Method.after_step` (MoCo's
momentum update). State that is not a persistent buffer (MoCo's memory bank) goes through
:meth:`Method.extra_state` so that ``--resume`` restores it exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.images import AugmentConfig
from fpsfl.base.settings import check, setting
from fpsfl.base.views import ViewSettings

from ..schedules import LR_SCHEDULES

# Crop + flip only: the augmentation of the classification baselines (multi-label fractals, supervised).
CROP_FLIP = AugmentConfig(jitter_p=0.0, grayscale_p=0.0, blur_p=0.0)


@dataclass(frozen=True)
class MethodConfig:
    """Optimiser settings every method has; subclasses add their own hyperparameters."""

    lr: float = setting(0.05, "per 256 samples, scaled linearly with the batch size (Goyal et al. 2017)",
                        within="(0, inf)")
    momentum: float = setting(0.9, "SGD momentum (Appendix A.2)", within="[0, 1)")
    weight_decay: float = setting(1e-4, "Appendix A.2", within="[0, inf)")
    lr_schedule: str = setting("cosine", "learning rate over the epochs, set once an epoch: cosine (decays "
                                         "to 0 over --epochs; SimSiam, MoCo-v2, Appendix A.2) or constant "
                                         "(the base lr throughout; issue 38)", choices=tuple(LR_SCHEDULES))
    warmup_epochs: float = setting(0.0, "epochs over which the lr rises linearly from 0 to the schedule's, "
                                        "set every step (0: none, the official code's; SimCLR warms up its "
                                        "first 10 epochs; issue 38)", within="[0, inf)")
    last_stage_lr: float = setting(1.0, "multiplier of the lr on the backbone's deepest stage (ResNet20's "
                                        "layer3): 1, the paper's; below 1 that stage turns more slowly "
                                        "than the rest, so it stays closer to a general feature map "
                                        "(issue 38: trained layer3 specialises to the fractal task)",
                                   within="(0, inf)")

    def __post_init__(self) -> None:
        check(self, style="key")

    def resolve(self, feature_dim: int, size: int = 32) -> MethodConfig:
        """This config with every size left to the recipe (None) filled in for a backbone of ``feature_dim``
        features at ``size`` px input; methods with heads override it."""
        return self

    def views(self, default: AugmentConfig) -> AugmentConfig:
        """The augmentation of the method's views: its class's ``default``, unless the config sets it."""
        return default


@dataclass(frozen=True)
class ViewsConfig(ViewSettings, MethodConfig):
    """A self-supervised method's settings (:class:`MethodConfig`'s first) plus its two views' augmentation
    (:class:`fpsfl.base.views.ViewSettings`), settable with ``--set``."""


HEADS = ("official", "imagenet")  # head sizes: the FPS code's (default) or the ImageNet recipes' (2048-wide)
IMAGENET_HIDDEN = 2048  # hidden width of the ImageNet heads (SimSiam §3; MoCo-v2's MLP)


def filled(cfg: MethodConfig, **sizes: int) -> MethodConfig:
    """``cfg`` with each of ``sizes`` that it leaves as None set to the given value."""
    return dataclasses.replace(cfg, **{k: v for k, v in sizes.items() if getattr(cfg, k) is None})


def feature_std(z: Tensor) -> Tensor:
    """Mean over dimensions of the batch std of the l2-normalised rows of z (B, D).

    The collapse signal of SimSiam (Chen & He 2021, §4.1): about 1/sqrt(D) when the outputs spread over the
    sphere, 0 when they collapse to one point. Take it before any affine-free BatchNorm: after one, every
    batch has zero mean and unit variance per dimension, so it reads 1/sqrt(D) whatever the rank of z
    (issue 38). :func:`split_head` gives that point.
    """
    return F.normalize(z.detach().float(), dim=1).std(dim=0).mean()


def split_head(head: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """(output before the head's last BatchNorm, the head's output) of a lightly head on x; when the head
    does not end in a BatchNorm both are its output."""
    layers = getattr(head, "layers", None)
    if isinstance(layers, nn.Sequential) and isinstance(layers[-1], nn.modules.batchnorm._BatchNorm):
        pre = layers[:-1](x)
        return pre, layers[-1](pre)
    out = head(x)
    return out, out


class Method(nn.Module):
    """A backbone plus heads and a loss. Subclasses set the class attributes and implement forward."""

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    n_views: ClassVar[int] = 2  # augmented views per sample the method consumes
    labels: ClassVar[str | None] = None  # None, "multihot" (float (B, J)) or "class" (int64 (B,))
    augment: AugmentConfig = AugmentConfig()  # MoCo-v2 / SimSiam augmentations (Appendix A); see ViewsConfig
    sync_bn: ClassVar[bool] = False  # under torchrun, BatchNorm statistics over all processes' samples

    def __init__(self, backbone: nn.Module, cfg: MethodConfig, n_classes: int | None = None):
        super().__init__()
        self.backbone, self.cfg = backbone, cfg
        self.augment = cfg.views(type(self).augment)  # an instance's views: the class's, or as cfg sets them

    def forward(self, views: Tensor, labels: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """views (n_views, B, 3, S, S) -> (scalar loss, detached statistics such as ``z_std``)."""
        raise NotImplementedError

    def param_groups(self) -> list[dict]:
        """Optimiser groups; a group with ``fixed_lr=True`` is kept off the learning-rate schedule. The first
        group is on it: its rate is the one ``metrics.jsonl`` logs."""
        return [{"params": [p for p in self.parameters() if p.requires_grad], "fixed_lr": False}]

    @torch.no_grad()
    def after_step(self) -> None:
        """Called after every optimiser step."""

    def kept_backbone(self) -> nn.Module:
        """The backbone the checkpoint keeps, and the one the signals (cosine to init, RankMe, the probe)
        describe: the trained one, unless the method keeps another (MoCo's ``keep=key``)."""
        return self.backbone

    def extra_state(self) -> dict[str, Tensor]:
        """Training state outside the state_dict, saved for --resume."""
        return {}

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        if state:
            raise ValueError(f"{self.name} has no extra state, got {sorted(state)}")
