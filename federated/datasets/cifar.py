"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) in torchvision's python-pickle format: the 32 px datasets of
Chen et al., ICLR 2023, §4.2, fine-tuned with ResNet20 under the Table 9 recipe."""

from __future__ import annotations

import os
import pickle

import numpy as np
import torch

from fpsfl.base import safepickle

from . import DataConfig, Preset, register_dataset
from .decode import DataError, Loaded, _labels, resize_uint8


def read_cifar(name: str, root: str, size: int, download: bool, verify: bool = True) -> Loaded:
    """CIFAR-10 or CIFAR-100 in the layout of torchvision's classes, whose file lists, md5 sums and download
    this uses; the sums are checked unless ``verify`` is off (a CIFAR-format folder that is not the
    published data, e.g. the recipes' smoke data). The pickles are read with :mod:`fpsfl.base.safepickle`
    (numpy arrays and plain data only), not torchvision's ``pickle.load``: a file cannot run code."""
    import torchvision.datasets.cifar as tv  # imported here: ~0.4 s, only CIFAR needs it

    cls = {"cifar10": tv.CIFAR10, "cifar100": tv.CIFAR100}[name]
    root = os.path.expanduser(root)
    folder = os.path.join(root, cls.base_folder)
    hint = f"extract {cls.filename} ({cls.url}) into {root!r}, or pass --download to fetch it"
    if not download and not os.path.isdir(folder):
        raise DataError(f"{name}: expected the files in {folder!r}, which does not exist; {hint}")
    files = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]

    def first_bad() -> str | None:  # tv.check_integrity is looked up on each call: the tests swap it
        return next((f for f, md5 in files if not tv.check_integrity(os.path.join(folder, f),
                                                                     md5 if verify else None)), None)

    try:
        if download and first_bad():
            tv.download_and_extract_archive(cls.url, root, filename=cls.filename, md5=cls.tgz_md5)
    except RuntimeError as e:  # torchvision: the downloaded archive fails its md5 sum
        raise DataError(f"{name}: the download into {root!r} is corrupted ({e}); {hint}") from e
    except OSError as e:  # a failed download (URLError is an OSError) or an unwritable folder
        raise DataError(f"{name}: cannot download into {root!r}: {e}") from e
    bad = first_bad()
    if bad:
        problem = "does not match its md5 sum" if os.path.isfile(os.path.join(folder, bad)) else "is absent"
        raise DataError(f"{name}: files in {folder!r} are missing or corrupted ({bad} {problem}); {hint}")
    key = "labels" if name == "cifar10" else "fine_labels"
    train_x, train_y = _read_split(folder, [f for f, _ in cls.train_list], key, size)
    test_x, test_y = _read_split(folder, [f for f, _ in cls.test_list], key, size)
    names = _unpickle(os.path.join(folder, cls.meta["filename"])).get(cls.meta["key"])
    if not isinstance(names, list):
        raise DataError(f"{name}: {os.path.join(folder, cls.meta['filename'])!r} lacks the list "
                        f"{cls.meta['key']!r} of class names")
    labels = torch.cat([train_y, test_y])
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(names)):
        raise DataError(f"{name}: labels in {folder!r} must lie in 0..{len(names) - 1} (one per class name), "
                        f"found {int(labels.min())}..{int(labels.max())}")
    return Loaded(train_x, train_y, test_x, test_y, [n.decode("latin1") if isinstance(n, bytes) else str(n)
                                                     for n in names])


def _read_split(folder: str, files: list[str], key: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (N, size, size, 3) channels-last images and int64 (N,) labels of the batch ``files``, each a
    dict with ``data`` uint8 (n, 3072) rows (the R plane, then G, then B of a 32 px image) and ``key``."""
    xs, ys = [], []
    for f in files:
        path, entry = os.path.join(folder, f), _unpickle(os.path.join(folder, f))
        try:
            data, labels = np.asarray(entry.get("data")), np.asarray(entry.get(key))
        except ValueError as e:  # a ragged list: numpy cannot make it an array (issue 42's loader table)
            raise DataError(f"{path!r} is not a CIFAR batch: 'data' and {key!r} must be arrays or lists of "
                            f"equal-length rows ({e})".replace("\n", " ")) from None
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),) \
                or not np.issubdtype(labels.dtype, np.integer):
            raise DataError(f"{path!r} is not a CIFAR batch: expected 'data' uint8 (N, 3072) and {key!r} N "
                            f"integers, got {data.dtype} {data.shape} and {labels.dtype} {labels.shape}")
        xs.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))  # (n, 32, 32, 3) HWC
        ys.append(labels)
    x = resize_uint8(torch.from_numpy(np.ascontiguousarray(np.concatenate(xs))), size)
    return x, _labels(np.concatenate(ys))


def _unpickle(path: str) -> dict:
    """The dict of one CIFAR pickle (Python 2 ``str`` keys read as ``str``, bytes keys decoded)."""
    try:
        with open(path, "rb") as f:
            entry = safepickle.load(f)
        return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    except safepickle.UnsafePickleError as e:
        raise DataError(f"{path!r}: {e}") from None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise DataError(f"{path!r} is not a CIFAR pickle (a pickled dict): {type(e).__name__}: {e}") from e


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
