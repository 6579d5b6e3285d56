"""The backbone registry shared by pre-training and federated training (Chen et al., ICLR 2023, §4.2, §4.5,
Fig. 5).

A backbone maps a float (B, 3, S, S) batch to pooled (B, feature_dim) features; classifiers, projection and
segmentation heads are built on top by their users from ``feature_dim``. The registry holds the paper's
networks, one file each registering itself with :func:`register_backbone`: the CIFAR ResNets with depth
20-56 and a width multiplier (:mod:`.cifar_resnet`), torchvision's ResNet18 (:mod:`.resnet18`) and
segmentation-models-pytorch's MobileNetV2 encoder (:mod:`.mobilenet_v2`), whose saved weights load straight
into its DeepLabV3+ model. Any timm model is reachable as ``timm:<name>``. torchvision, smp and timm are
imported only when such a network is built, so naming the registry costs no start-up time.

Nothing is ever downloaded: every network starts from random weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from fpsfl.base.registry import Registry

TIMM_PREFIX = "timm:"  # ``timm:<name>`` builds timm.create_model(name, pretrained=False, num_classes=0)


class BackboneError(ValueError):
    """A backbone that cannot be built or cannot take the requested inputs; its message is one line."""


@dataclass(frozen=True)
class BackboneSpec:
    """How to build one backbone and which input sides it takes."""

    build: Callable[[float], nn.Module]  # width multiplier -> module with an int ``feature_dim``
    min_size: int  # px, smallest input side it accepts
    size_multiple: int  # px, the input side must be a multiple of this (1: any side)
    has_width: bool  # whether the width multiplier is meaningful (otherwise it must be 1)
    description: str  # one line, for --help

    @property
    def sizes(self) -> str:
        """The accepted input sides, in words."""
        if self.size_multiple > 1:
            return f"sides that are multiples of {self.size_multiple} px, at least {self.min_size} px"
        return f"sides of at least {self.min_size} px"


BACKBONES: Registry[BackboneSpec] = Registry("backbone", discover="pretrain.backbones")


def register_backbone(name: str, *, min_size: int, size_multiple: int = 1, has_width: bool = False,
                      description: str) -> Callable:
    """Decorator of a builder ``width -> module`` registering it as backbone ``name``."""
    def add(build: Callable[[float], nn.Module]) -> Callable[[float], nn.Module]:
        BACKBONES.register(BackboneSpec(build, min_size, size_multiple, has_width, description), name=name)
        return build
    return add


def arch_names() -> list[str]:
    """The registry's names, then the literal ``timm:<name>`` standing for any timm model."""
    return [*BACKBONES, f"{TIMM_PREFIX}<name>"]


def _timm(name: str, width: float) -> nn.Module:
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=0)
    # num_classes=0 keeps timm's pooled pre-logits output: head_hidden_size wide where the head has a hidden
    # layer (MobileNetV3: 1024, while num_features is 576), num_features wide otherwise
    model.feature_dim = int(getattr(model, "head_hidden_size", None) or model.num_features)
    return model


def backbone_spec(arch: str) -> BackboneSpec:
    """The spec of a registry name or of ``timm:<name>``; raises :class:`BackboneError` for unknown ones."""
    if arch in BACKBONES:
        return BACKBONES[arch]
    if arch.startswith(TIMM_PREFIX):
        import timm

        name = arch[len(TIMM_PREFIX):]
        if not name or not timm.is_model(name):
            raise BackboneError(f"unknown timm model {name!r} in {arch!r}; see timm.list_models() for names")
        return BackboneSpec(build=partial(_timm, name), min_size=1, size_multiple=1, has_width=False,
                            description=f"timm {name}, random init")
    raise BackboneError(f"unknown backbone {arch!r}; choose one of {', '.join(arch_names())}")


def _check_width(arch: str, spec: BackboneSpec, width: float) -> None:
    if not (math.isfinite(width) and width > 0):
        raise BackboneError(f"width must be a finite number > 0, got {width}")
    if width != 1 and not spec.has_width:
        raise BackboneError(f"{arch} has no width multiplier: width must be 1, got {width}")


def create_backbone(arch: str, width: float = 1.0) -> nn.Module:
    """A randomly initialised backbone mapping (B, 3, S, S) to (B, feature_dim); see :data:`BACKBONES`."""
    spec = backbone_spec(arch)
    _check_width(arch, spec, width)
    return spec.build(width)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_backbone(arch: str, width: float, size: int) -> None:
    """Raise :class:`BackboneError` unless ``arch`` at ``width`` takes ``size`` px inputs.

    timm models are checked by a dry forward of one zero image, which catches fixed input sizes (ViTs).
    """
    spec = backbone_spec(arch)
    _check_width(arch, spec, width)
    if size < spec.min_size or size % spec.size_multiple:
        raise BackboneError(f"{arch} cannot take {size} px inputs; it takes {spec.sizes}")
    if not arch.startswith(TIMM_PREFIX):
        return
    model = spec.build(width).eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(1, 3, size, size))
    except Exception as exc:  # any failure of the dry run means these inputs do not work
        raise BackboneError(f"{arch} cannot take {size} px inputs: {_one_line(exc)}") from exc
    if tuple(out.shape) != (1, model.feature_dim):
        raise BackboneError(f"{arch} returns {tuple(out.shape)} at {size} px, not pooled (1, "
                            f"{model.feature_dim}) features")
