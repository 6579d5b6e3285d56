"""Typed configuration of a pre-training run, with the paper's defaults (Chen et al., ICLR 2023, App. A.2).

:class:`PretrainConfig` is what defines the result: the same config gives the same weights on CPU, and
``--resume`` refuses a run directory whose config differs. :class:`RunOptions` says how to execute it
(device, workers, paths) and does not change the result on CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .methods import METHODS, MethodConfig


@dataclass(frozen=True)
class PretrainConfig:
    source: str = "fps"  # fps | fractal-single | multilabel | images | supervised (see pretrain.sources)
    method: str = "simsiam"  # §4.2: FPS is trained with SimSiam (or MoCo-v2)
    arch: str = "resnet20"  # §4.2: ResNet20 at 32 px (ResNet18 at 224 px)
    width: float = 1.0  # channel multiplier of the CIFAR ResNets (Fig. 5)
    size: int = 32  # px, input side (32 for CIFAR-scale, 224 for Tiny-ImageNet/iNat/Cityscapes)
    epochs: int = 100  # Appendix A.2
    pairs_per_epoch: int = 1_000_000  # Appendix A.2: 1M pairs per epoch (fractal sources only)
    batch_size: int = 256  # pairs (or images) per step, Appendix A.2
    seed: int = 0
    method_args: dict[str, Any] = field(default_factory=dict)  # overrides of the method's config (--set)
    root: str | None = None  # image folder (images, supervised)
    bank: str | None = None  # IFS code bank .npz; None: the paper's 100K codes sampled from seed
    n_classes: int = 1000  # multilabel: J fractal classes (Anderson & Farrell 2022)
    amp: bool = False  # bf16 autocast (CUDA)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        for name in ("epochs", "pairs_per_epoch", "batch_size", "size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        self.method_config()  # type-check the overrides now, not at step 1

    def method_config(self) -> MethodConfig:
        """The method's config with ``method_args`` applied; unknown keys and bad types are errors."""
        cls = METHODS[self.method].Config
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in self.method_args.items():
            if key not in known:
                raise ValueError(f"{self.method} has no setting {key!r}; it has {', '.join(known)}")
            values[key] = coerce(key, value, type(getattr(cls(), key)))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def coerce(key: str, value: Any, kind: type) -> Any:
    """``value`` (a string from --set, or a JSON value) as ``kind``; ValueError naming ``key`` otherwise."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    text = str(value).strip().lower()
    try:
        if kind is bool:
            if text not in ("true", "false", "1", "0"):
                raise ValueError
            return text in ("true", "1")
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        pass
    raise ValueError(f"setting {key!r} must be a {kind.__name__}, got {value!r}")


@dataclass(frozen=True)
class RunOptions:
    out: Path  # the backbone checkpoint
    run_dir: Path  # config.json, metrics.jsonl, state.pt
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    workers: int = 0  # DataLoader worker processes rendering fractals / decoding images
    resume: bool = False
    profile: bool = False  # synchronise each step to split its time into data wait and compute
    progress: bool = True
    stop_after: int | None = None  # stop after this many epochs of this invocation (tests of --resume)


def default_run_dir(out: Path) -> Path:
    """The run directory beside ``out``: ``fps.ckpt`` -> ``fps.run/``."""
    return out.with_name(f"{out.stem}.run")
