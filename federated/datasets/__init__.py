"""The datasets that ``federate`` fine-tunes on, looked up by name in :data:`DATASETS`.

Chen et al., ICLR 2023: CIFAR-10/100 at 32 px, Tiny-ImageNet at 64 px and iNaturalist-GEO at 224 px
(ResNet18, §4.2, Tables 1, 8 and 9), and a labelled image folder for the medical images of §4.5.
``digits`` (scikit-learn's 8 x 8 digits upsampled to 32 px) is embedded, needs no files, and is the default
for smoke runs. ``cityscapes`` is the
segmentation task of Table 5 (DeepLabV3+ with MobileNetV2, 18 city clients, 768 px crops): its images are
(N, H, W, 3) at a stored height H (1024 px, full resolution, by default) and its labels (N, H, W) train ids.

A dataset is one module of this package (as timm's models): a reader ``read(cfg, stored) -> Loaded`` that
carries ``@register_dataset(name, ...)`` with its sizes, description and Table-9 :class:`Preset`. The first
lookup in :data:`DATASETS` imports every module here, so adding a dataset touches that one file; readers
import torchvision, scikit-learn and the like only when called, so naming the registry stays cheap.

:func:`load_dataset` returns an :class:`ImageData` held in memory as uint8 channels-last (N, S, S, 3) at the
stored side S (32 px for CIFAR/digits, 64 px for folder datasets, to bound memory) with ``val_fraction`` of
the training set held out (§4.2 reserves 2% for tuning). A folder dataset too large for memory (and
iNaturalist-GEO, always) holds :class:`~federated.datasets.stream.StreamedImages` instead, decoded batch by
batch (``--decode``; :mod:`federated.datasets.stream`). The model sees ``input_size`` px; the batch
augmentation of :mod:`federated.tasks.transforms` crops and resizes on the device. The rule, shared by all
datasets:
stored images of at most 32 px are trained at 32 px (the CIFAR recipe), larger ones at the dataset's input
size (224 px for the ImageNet-style settings); the CLI may override it later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from fpsfl.base.registry import Registry
from fpsfl.base.settings import check, union_fields

from .decode import DataError, Loaded
from .stream import StreamedImages, take, wants_stream

__all__ = ["DATASETS", "DataConfig", "DataError", "DatasetSettings", "DatasetSpec", "ImageData", "Loaded",
           "Preset", "StreamedImages", "input_size_for", "keep_rows", "load_dataset", "own_settings",
           "register_dataset", "setting_fields", "split_validation"]

SMALL_SIDE = 32  # px: stored images this small are trained at 32 px (CIFAR, §4.2)


class Preset(NamedTuple):
    """A dataset's local training recipe (Table 9); ``federate`` uses it unless --lr etc. are given."""

    lr: float
    batch_size: int
    optimizer: str  # sgd (momentum, weight decay) | adam
    algos: dict[str, dict[str, Any]] = {}  # algorithm settings this dataset changes (below --set); read-only


@dataclass(frozen=True)
class DatasetSettings:
    """Base of a dataset's own settings (``--split-csv`` for inat-geo, ``--crop-size`` for cityscapes): a
    frozen dataclass of :func:`~fpsfl.base.settings.setting` fields declared in the dataset's file and
    given to :func:`register_dataset`; its fields become flags. Validated on construction (one line).
    ``SPLIT`` names the fields that decide which samples a client holds: a shard manifest records them."""

    SPLIT: tuple[str, ...] = ()  # a class attribute, not a field (no annotation in subclasses)

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"  # a key of DATASETS
    root: str | None = None  # data folder (--data-root); unused by digits
    download: bool = False  # torchvision download for cifar10/100 (users with a network)
    store_size: int | None = None  # px side (cityscapes: height) images are held at; None: the default
    options: Mapping[str, Any] = field(default_factory=dict)  # the datasets' own settings by name (their
    # DatasetSettings fields, e.g. split_csv); a reader takes its own with own_settings(cfg)
    decode: str = "auto"  # auto | memory | stream: folder images held in memory or decoded per batch
    verify: bool = True  # check CIFAR's files against their published md5 sums
    val_fraction: float = 0.02  # held-out share of the training set (§4.2 reserves 2% for tuning)
    seed: int = 0  # fixes the validation split

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise DataError(f"val_fraction must lie in [0, 1), got {self.val_fraction}")
        if self.store_size is not None and self.store_size <= 0:
            raise DataError(f"store_size must be positive, got {self.store_size}")
        if self.seed < 0:
            raise DataError(f"seed must be non-negative, got {self.seed}")
        wants_stream(self.decode, 0, 1)  # a bad mode is a DataError now


@dataclass
class ImageData:
    train_x: torch.Tensor  # uint8 (N, S, S, 3), channels-last like fractal renders, S = stored side (or
    # StreamedImages of that shape: files decoded per batch, federated.datasets.stream)
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
                 if isinstance(getattr(self, f.name), torch.Tensor | StreamedImages)}
        return dataclasses.replace(self, **moved)


@dataclass(frozen=True)
class DatasetSpec:
    load: Callable[[DataConfig], ImageData]  # no validation split yet (load_dataset makes it)
    store_size: int  # px, default stored side
    input_size: int  # px, default model input side (Table 9 / §4.2 settings)
    needs_root: bool  # needs --data-root
    description: str  # one line: what and where the files are
    preset: Preset  # lr, batch size, optimiser (Table 9) and the algorithm settings this dataset changes
    hflip: bool = True  # horizontal flips keep the label
    default_partition: str = "dirichlet"  # natural for datasets whose clients are given (iNat-GEO, cities)
    default_arch: str = "resnet20"  # §4.2: ResNet20 at 32 px, ResNet18 at 224 px; Table 5: MobileNetV2
    task: str = "classification"  # a key of federated.tasks.TASKS: classification | segmentation
    streams: bool = False  # its reader can leave images as files (--decode stream)
    settings: type[DatasetSettings] = DatasetSettings  # its own settings (flags), declared in its file


Reader = Callable[[DataConfig, int], Loaded]  # (config, stored side in px) -> arrays, no validation split

DATASETS: Registry[DatasetSpec] = Registry("dataset", discover="federated.datasets")


def register_dataset(name: str, *, store_size: int, input_size: int, needs_root: bool, description: str,
                     preset: Preset, hflip: bool = True, default_partition: str = "dirichlet",
                     default_arch: str | None = None, task: str = "classification",
                     streams: bool = False,
                     settings: type[DatasetSettings] = DatasetSettings) -> Callable[[Reader], Reader]:
    """Decorator of a reader ``read(cfg, stored) -> Loaded`` registering it as dataset ``name``; the reader
    is returned unchanged. ``default_arch`` None: ResNet20 up to 32 px inputs, ResNet18 above (§4.2).
    ``settings``: the dataset's own flags, read by its reader with :func:`own_settings`."""
    def add(read: Reader) -> Reader:
        spec = _spec(read, store_size, input_size, needs_root, description, preset, hflip, default_partition,
                     default_arch, task, streams)
        DATASETS.register(dataclasses.replace(spec, settings=settings), name=name)
        return read
    return add


def setting_fields() -> dict[str, dataclasses.Field]:
    """Every registered dataset's own settings by name, in registry order (one flag each; two datasets may
    share one only with the same default)."""
    owners = {name: spec.settings for name, spec in DATASETS.items()}
    return union_fields(owners, "dataset", {f.name: "DataConfig" for f in dataclasses.fields(DataConfig)})


def split_settings() -> tuple[str, ...]:
    """The dataset settings that decide a client's samples (each dataset's ``SPLIT``), in registry order."""
    names = (name for spec in DATASETS.values() for name in spec.settings.SPLIT)
    return tuple(dict.fromkeys(names))


def own_settings(cfg: DataConfig) -> DatasetSettings:
    """The settings of ``cfg``'s dataset, typed and checked, from ``cfg.options`` (those of other datasets
    ignored, missing ones at their defaults); a bad value is a one-line DataError."""
    cls = DATASETS.lookup(cfg.name, DataError).settings
    try:
        return cls(**{f.name: cfg.options[f.name] for f in dataclasses.fields(cls) if f.name in cfg.options})
    except ValueError as exc:
        raise DataError(f"{cfg.name}: {exc}") from None


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


def _spec(read: Reader, store_size: int, input_size: int, needs_root: bool, description: str, preset: Preset,
          hflip: bool, default_partition: str, default_arch: str | None, task: str,
          streams: bool) -> DatasetSpec:
    """A DatasetSpec whose load reads at the configured (or default) stored side, with an empty val split.

    Classification follows the small-side rule of :func:`input_size_for`; a segmentation input is a crop
    (768 px in Table 5) of the stored image, whatever its stored size."""

    def load(cfg: DataConfig) -> ImageData:
        stored = cfg.store_size or store_size
        data = read(cfg, stored)
        empty = data.train_x[:0]
        n_classes = len(data.classes)
        # the stored side the reader actually used (an image folder of small images keeps their own size)
        model_input = (input_size_for(input_size, data.train_x.shape[1]) if task == "classification"
                       else input_size)
        return ImageData(data.train_x, data.train_y, data.test_x, data.test_y, empty, data.train_y[:0],
                         n_classes, data.classes, data.clients, model_input, hflip, task)

    arch = default_arch or ("resnet20" if input_size <= 32 else "resnet18")
    return DatasetSpec(load, store_size, input_size, needs_root, description, preset, hflip,
                       default_partition, arch, task, streams)


def load_dataset(cfg: DataConfig) -> ImageData:
    """The dataset of ``cfg`` in memory, ``val_fraction`` of the training set split off under ``seed``."""
    spec = DATASETS.lookup(cfg.name, DataError)  # "unknown dataset 'x'; choose from ..." as one line
    if spec.needs_root and not cfg.root:
        raise DataError(f"dataset {cfg.name!r} needs --data-root DIR: {spec.description}")
    if cfg.decode == "stream" and not spec.streams:
        raise DataError(f"--decode stream: {cfg.name} is held in memory (its files are not one image each); "
                        f"streaming is for tinyimagenet, inat-geo and imagefolder")
    data = spec.load(cfg)
    train, val = split_validation(len(data.train_y), cfg.val_fraction, cfg.seed)
    val_x, val_y = take(data.train_x, val), data.train_y[val]  # copies, taken before the rows move
    clients = None if data.clients is None else keep_rows(data.clients, train)
    return dataclasses.replace(data, train_x=keep_rows(data.train_x, train),
                               train_y=keep_rows(data.train_y, train), val_x=val_x, val_y=val_y,
                               clients=clients)


def keep_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x[keep]`` for sorted distinct ``keep``, computed in place: row keep[i] moves to row i (keep[i] >= i,
    so no row is overwritten before it moves) and the result is a view of ``x``, which is overwritten.

    Fancy indexing would hold a second copy of the training set at once: 18.7 GB more for Cityscapes at
    full resolution. Also faster than indexing (0.04 s vs 0.16 s for 50,000 CIFAR images). Streamed images
    stay files: their subset is taken."""
    if isinstance(x, StreamedImages):
        return x.subset(keep)
    rows = x.numpy()  # a view: loaders return CPU tensors they own
    for i, j in enumerate(keep.tolist()):
        if i != j:
            rows[i] = rows[j]
    return x[:len(keep)]
