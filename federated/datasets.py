"""The datasets that ``federate`` fine-tunes on, looked up by name in :data:`DATASETS`.

Chen et al., ICLR 2023: CIFAR-10/100 at 32 px, Tiny-ImageNet and iNaturalist-GEO at 224 px (ResNet18, §4.2,
Table 9), and a labelled image folder for the medical images of §4.5. ``digits`` (scikit-learn's 8 x 8 digits
upsampled to 32 px) is embedded, needs no files, and is the default for smoke runs. ``cityscapes`` is the
segmentation task of Table 5 (DeepLabV3+ with MobileNetV2, 18 city clients, 768 px crops): its images are
(N, H, W, 3) at a stored height H (1024 px, full resolution, by default) and its labels (N, H, W) train ids.

:func:`load_dataset` returns an :class:`ImageData` held in memory as uint8 channels-last (N, S, S, 3) at the
stored side S (32 px for CIFAR/digits, 64 px for folder datasets, to bound memory) with ``val_fraction`` of
the training set held out (§4.2 reserves 2% for tuning). The model sees ``input_size`` px; the batch
augmentation of :mod:`federated.augment` crops and resizes on the device. The rule, shared by all datasets:
stored images of at most 32 px are trained at 32 px (the CIFAR recipe), larger ones at the dataset's input
size (224 px for the ImageNet-style settings); the CLI may override it later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .loaders import (
    DataError,
    Loaded,
    read_cifar,
    read_cityscapes,
    read_imagefolder,
    read_inat_geo,
    read_tinyimagenet,
)

__all__ = ["DATASETS", "DataConfig", "DataError", "DatasetSpec", "ImageData", "input_size_for", "keep_rows",
           "load_dataset", "split_validation"]

SMALL_SIDE = 32  # px: stored images this small are trained at 32 px (CIFAR, §4.2)
DIGITS_TEST = 0.2  # share of sklearn's 1,797 digits in the fixed test set
DIGITS_LEVELS = 16  # sklearn's digits take values 0..16


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"  # a key of DATASETS
    root: str | None = None  # data folder (--data-root); unused by digits
    download: bool = False  # torchvision download for cifar10/100 (users with a network)
    store_size: int | None = None  # px side (cityscapes: height) images are held at; None: the default
    split_csv: str | None = None  # inat-geo: the client split CSV (Hsu et al. 2020)
    val_fraction: float = 0.02  # held-out share of the training set (§4.2 reserves 2% for tuning)
    seed: int = 0  # fixes the validation split

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise DataError(f"val_fraction must lie in [0, 1), got {self.val_fraction}")
        if self.store_size is not None and self.store_size <= 0:
            raise DataError(f"store_size must be positive, got {self.store_size}")
        if self.seed < 0:
            raise DataError(f"seed must be non-negative, got {self.seed}")


@dataclass
class ImageData:
    train_x: torch.Tensor  # uint8 (N, S, S, 3), channels-last like fractal renders, S = stored side
    train_y: torch.Tensor  # int64 (N,); segmentation: uint8 (N, H, W) train ids (images (N, H, W, 3))
    test_x: torch.Tensor  # uint8 (M, S, S, 3)
    test_y: torch.Tensor  # int64 (M,); segmentation: uint8 (M, H, W)
    val_x: torch.Tensor  # uint8 (V, S, S, 3): the held-out val_fraction of the training set
    val_y: torch.Tensor  # int64 (V,)
    n_classes: int
    classes: list[str]
    clients: torch.Tensor | None  # int64 (N,) natural client of every training sample (inat-geo, cities)
    input_size: int  # px the model sees
    hflip: bool = True  # whether horizontal flips keep the label (not for digits: a mirrored 2 is no 2)
    task: str = "classification"  # classification: y (N,) class ids; segmentation: y (N, H, W) train ids

    def to(self, device: torch.device | str) -> ImageData:
        """A copy with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)


@dataclass(frozen=True)
class DatasetSpec:
    load: Callable[[DataConfig], ImageData]  # no validation split yet (load_dataset makes it)
    store_size: int  # px, default stored side
    input_size: int  # px, default model input side (Table 9 / §4.2 settings)
    needs_root: bool  # needs --data-root
    description: str  # one line: what and where the files are
    hflip: bool = True  # horizontal flips keep the label
    default_partition: str = "dirichlet"  # natural for datasets whose clients are given (iNat-GEO, cities)
    default_arch: str = "resnet20"  # §4.2: ResNet20 at 32 px, ResNet18 at 224 px; Table 5: MobileNetV2
    task: str = "classification"  # a key of federated.tasks.TASKS: classification | segmentation


def input_size_for(default_input: int, stored: int) -> int:
    """The model input side: 32 px when the stored side is <= 32, else the dataset's default."""
    return SMALL_SIDE if stored <= SMALL_SIDE else default_input


def split_validation(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) int64 indices partitioning range(n), each sorted; round(fraction n) val under ``seed``."""
    n_val = int(round(fraction * n))
    if n_val >= n:
        raise DataError(f"val_fraction {fraction} leaves no training images out of {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_val:].sort().values, perm[:n_val].sort().values


def _digits(size: int) -> Loaded:
    """sklearn's 1,797 digits, upsampled (bilinear) to size px grey RGB, 0..255; a fixed stratified 80/20
    split (seed 0 whatever the config's seed, so the test set never changes)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.from_numpy(digits.images).float()[:, None] * (255 / DIGITS_LEVELS)  # (N, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).expand(-1, -1, -1, 3).contiguous()
    y = torch.from_numpy(digits.target.astype(np.int64))
    train, test = train_test_split(np.arange(len(y)), test_size=DIGITS_TEST, stratify=digits.target,
                                   random_state=0)
    train, test = torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(test))
    return Loaded(x[train], y[train], x[test], y[test], [str(d) for d in range(10)])


def _spec(read: Callable[[DataConfig, int], Loaded], store_size: int, input_size: int, needs_root: bool,
          description: str, hflip: bool = True, default_partition: str = "dirichlet",
          default_arch: str | None = None, task: str = "classification") -> DatasetSpec:
    """A DatasetSpec whose load reads at the configured (or default) stored side, with an empty val split.

    Classification follows the small-side rule of :func:`input_size_for`; a segmentation input is a crop
    (768 px in Table 5) of the stored image, whatever its stored size."""

    def load(cfg: DataConfig) -> ImageData:
        stored = cfg.store_size or store_size
        data = read(cfg, stored)
        empty = data.train_x[:0]
        n_classes = len(data.classes)
        model_input = input_size_for(input_size, stored) if task == "classification" else input_size
        return ImageData(data.train_x, data.train_y, data.test_x, data.test_y, empty, data.train_y[:0],
                         n_classes, data.classes, data.clients, model_input, hflip, task)

    arch = default_arch or ("resnet20" if input_size <= 32 else "resnet18")
    return DatasetSpec(load, store_size, input_size, needs_root, description, hflip, default_partition, arch,
                       task)


DATASETS: dict[str, DatasetSpec] = {
    "cifar10": _spec(lambda cfg, s: read_cifar("cifar10", cfg.root, s, cfg.download), 32, 32, True,
                     "CIFAR-10: ROOT/cifar-10-batches-py/ (torchvision format; --download fetches it)"),
    "cifar100": _spec(lambda cfg, s: read_cifar("cifar100", cfg.root, s, cfg.download), 32, 32, True,
                      "CIFAR-100: ROOT/cifar-100-python/ (torchvision format; --download fetches it)"),
    "tinyimagenet": _spec(lambda cfg, s: read_tinyimagenet(cfg.root, s), 64, 224, True,
                          "Tiny-ImageNet: ROOT/tiny-imagenet-200/ (or that folder itself); val = test"),
    "inat-geo": _spec(lambda cfg, s: read_inat_geo(cfg.root, cfg.split_csv, s), 64, 224, True,
                      "iNaturalist-2017 images under ROOT with a GEO client split CSV (--split-csv)",
                      default_partition="natural"),
    "imagefolder": _spec(lambda cfg, s: read_imagefolder(cfg.root, s), 64, 224, True,
                         "a labelled folder ROOT/train/<class>/ and ROOT/test/<class>/ (e.g. chest X-rays)"),
    "digits": _spec(lambda cfg, s: _digits(s), 32, 32, False,
                    "scikit-learn's 8x8 digits at 32 px, embedded (1,437 train / 360 test)", hflip=False),
    # Table 5: stored at full resolution (1024 x 2048; 25 GB of train images + labels), 768 px crops
    "cityscapes": _spec(lambda cfg, s: read_cityscapes(cfg.root, s), 1024, 768, True,
                        "Cityscapes fine: ROOT/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png and "
                        "ROOT/gtFine/{train,val}/<city>/*_gtFine_labelIds.png; cities = clients, val = test; "
                        "--store-size is the height (512 quarters the 25 GB)",
                        default_partition="natural", default_arch="mobilenet_v2", task="segmentation"),
}


def load_dataset(cfg: DataConfig) -> ImageData:
    """The dataset of ``cfg`` in memory, ``val_fraction`` of the training set split off under ``seed``."""
    spec = DATASETS.get(cfg.name)
    if spec is None:
        raise DataError(f"unknown dataset {cfg.name!r}; choose from {', '.join(DATASETS)}")
    if spec.needs_root and not cfg.root:
        raise DataError(f"dataset {cfg.name!r} needs --data-root DIR: {spec.description}")
    data = spec.load(cfg)
    train, val = split_validation(len(data.train_y), cfg.val_fraction, cfg.seed)
    val_x, val_y = data.train_x[val], data.train_y[val]  # copies, taken before the rows move
    clients = None if data.clients is None else keep_rows(data.clients, train)
    return dataclasses.replace(data, train_x=keep_rows(data.train_x, train),
                               train_y=keep_rows(data.train_y, train), val_x=val_x, val_y=val_y,
                               clients=clients)


def keep_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x[keep]`` for sorted distinct ``keep``, computed in place: row keep[i] moves to row i (keep[i] >= i,
    so no row is overwritten before it moves) and the result is a view of ``x``, which is overwritten.

    Fancy indexing would hold a second copy of the training set at once: 18.7 GB more for Cityscapes at
    full resolution. Also faster than indexing (0.04 s vs 0.16 s for 50,000 CIFAR images)."""
    rows = x.numpy()  # a view: loaders return CPU tensors they own
    for i, j in enumerate(keep.tolist()):
        if i != j:
            rows[i] = rows[j]
    return x[:len(keep)]
