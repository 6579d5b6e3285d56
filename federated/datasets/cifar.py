"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) in torchvision's python-pickle format: the 32 px datasets of
Chen et al., ICLR 2023, §4.2, fine-tuned with ResNet20 under the Table 9 recipe."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from . import DataConfig, Preset, register_dataset
from .decode import DataError, Loaded, _labels, resize_uint8


def read_cifar(name: str, root: str, size: int, download: bool, verify: bool = True) -> Loaded:
    """CIFAR-10 or CIFAR-100 through the torchvision classes, which check the files' md5 sums unless
    ``verify`` is off (a CIFAR-format folder that is not the published data, e.g. the recipes' smoke data)."""
    from torchvision.datasets import CIFAR10, CIFAR100  # imported here: ~0.4 s, only CIFAR needs it

    cls = {"cifar10": CIFAR10, "cifar100": CIFAR100}[name]
    folder = os.path.join(os.path.expanduser(root), cls.base_folder)
    hint = f"extract {cls.filename} ({cls.url}) into {root!r}, or pass --download to fetch it"
    if not download and not os.path.isdir(folder):
        raise DataError(f"{name}: expected the files in {folder!r}, which does not exist; {hint}")
    try:
        with _md5(verify):
            train = cls(os.path.expanduser(root), train=True, download=download)
            test = cls(os.path.expanduser(root), train=False, download=False)
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted" (a file missing or bad md5)
        raise DataError(f"{name}: files in {folder!r} are missing or corrupted ({e}); {hint}") from e
    except OSError as e:  # a failed download (URLError is an OSError) or an unreadable file
        raise DataError(f"{name}: cannot read or download into {folder!r}: {e}") from e

    def images(ds) -> torch.Tensor:
        return resize_uint8(torch.from_numpy(np.ascontiguousarray(ds.data)), size)  # (N, 32, 32, 3) HWC

    return Loaded(images(train), _labels(train.targets), images(test), _labels(test.targets),
                  list(train.classes))


@contextmanager
def _md5(verify: bool) -> Iterator[None]:
    """torchvision's CIFAR integrity check as is, or (``verify`` off) one that only asks that the file
    exists; the class reads ``check_integrity`` from its module when called, so it is swapped there."""
    if verify:
        yield
        return
    import torchvision.datasets.cifar as module

    checked = module.check_integrity
    module.check_integrity = lambda fpath, md5=None: os.path.isfile(fpath)
    try:
        yield
    finally:
        module.check_integrity = checked


@register_dataset(
    "cifar10", store_size=32, input_size=32, needs_root=True,
    description="CIFAR-10: ROOT/cifar-10-batches-py/ (torchvision format; --download fetches it)",
    preset=Preset(0.01, 32, "sgd", {"moon": {"mu": 5.0}}),  # MOON's own CIFAR-10 mu (Li et al. 2021)
)
def cifar10(cfg: DataConfig, stored: int) -> Loaded:
    """CIFAR-10 from ``cfg.root`` (fetched there first with ``cfg.download``)."""
    return read_cifar("cifar10", cfg.root, stored, cfg.download, cfg.verify)


@register_dataset(
    "cifar100", store_size=32, input_size=32, needs_root=True,
    description="CIFAR-100: ROOT/cifar-100-python/ (torchvision format; --download fetches it)",
    preset=Preset(0.01, 32, "sgd"),
)
def cifar100(cfg: DataConfig, stored: int) -> Loaded:
    """CIFAR-100 (the 100 fine labels) from ``cfg.root`` (fetched there first with ``cfg.download``)."""
    return read_cifar("cifar100", cfg.root, stored, cfg.download, cfg.verify)
