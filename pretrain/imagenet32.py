"""Down-sampled ImageNet 32 x 32 as Chrabaszcz et al. 2017 publish it: the pre-training data of the paper's
ResNet20 "ImageNet" init (Chen et al., ICLR 2023, §4.2: "for ResNet20, we pre-train the weights using
down-sampled, 32 x 32 ImageNet images").

The published training set (Imagenet32_train.zip) is ten pickled files ``train_data_batch_1`` ..
``train_data_batch_10``, each a dict with ``data``, uint8 (N, 3 S^2) rows holding the R plane, then G, then
B (channel-major), ``labels``, class ids 1..1000 (1-based), and ``mean``; the validation set
(Imagenet32_val.zip) is ``val_data`` in the same form. ``pretrain supervised --format imagenet32 --root DIR``
trains on the ten training files (``val_data`` is not used in pre-training). The whole set is held in memory
channels-last (1.28M x 3 KB = 3.9 GB at 32 px) and batches are cut from it in the order of
:class:`pretrain.folder.FolderSource` (same seeds, same torchrun sharding). The files of Imagenet64x64 have
the same layout with S = 64; the side is read from the rows.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle

import numpy as np
import torch
from torch.utils.data import Dataset

from fpsfl.base import safepickle

from .folder import FolderConfig, FolderError, FolderSource

TRAIN_FILES = tuple(f"train_data_batch_{i}" for i in range(1, 11))
N_CLASSES = 1000  # the ImageNet-1k ids of the published files


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, S, S, 3) channels-last, labels int64 (N,) 0-based) of one pickled batch file, read
    with :mod:`fpsfl.base.safepickle` (numpy arrays and plain data only: a file cannot run code) and checked
    against the published form, so that a stray file fails here, not as a 200,000-way head or wrapped
    pixels."""
    try:
        with open(path, "rb") as f:
            record = safepickle.load(f)  # latin1: Python 2 pickles too (it keeps bytes as is)
        record = {k.decode() if isinstance(k, bytes) else k: v for k, v in record.items()}
        data, labels = np.asarray(record["data"]), np.asarray(record["labels"])
    except safepickle.UnsafePickleError as e:
        raise FolderError(f"{path!r}: {e}") from None
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, AttributeError, ValueError, TypeError) as e:
        raise FolderError(f"{path!r} is not a down-sampled ImageNet batch (a pickled dict with 'data' and "
                          f"'labels'): {type(e).__name__}: {e}".replace("\n", " ")) from e
    return _channels_last(path, data), _labels_0_based(path, labels, len(data))


def _channels_last(path: str, data: np.ndarray) -> np.ndarray:
    """uint8 (N, S, S, 3) from the (N, 3 S^2) channel-major rows; refuses values a uint8 cast would wrap."""
    side = math.isqrt(data.shape[1] // 3) if data.ndim == 2 else 0
    if data.ndim != 2 or side == 0 or 3 * side * side != data.shape[1] or len(data) == 0:
        raise FolderError(f"{path!r}: 'data' must be (N, 3 S^2) rows with N >= 1, got shape {data.shape}")
    if data.dtype != np.uint8:
        integer = np.issubdtype(data.dtype, np.integer)
        if not integer or data.min() < 0 or data.max() > 255:
            found = f"{data.min()}..{data.max()}" if integer else f"dtype {data.dtype}"
            raise FolderError(f"{path!r}: 'data' must hold 8-bit pixel values (integers 0..255), found "
                              f"{found}")
        data = data.astype(np.uint8)
    return data.reshape(-1, 3, side, side).transpose(0, 2, 3, 1)


def _labels_0_based(path: str, labels: np.ndarray, n: int) -> np.ndarray:
    """int64 (N,) 0-based from the published 1-based ids 1..1000; a column (N, 1) is refused, not guessed."""
    if labels.shape != (n,):
        raise FolderError(f"{path!r}: 'labels' must be a flat list of one class id per row ({n} rows), got "
                          f"shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise FolderError(f"{path!r}: 'labels' must be integer class ids, found dtype {labels.dtype}")
    if labels.min() < 1 or labels.max() > N_CLASSES:
        raise FolderError(f"{path!r}: labels must be 1-based class ids (1..{N_CLASSES}), found "
                          f"{labels.min()}..{labels.max()}")
    return labels.astype(np.int64) - 1


def read_imagenet32(root: str) -> tuple[np.ndarray, np.ndarray]:
    """The ten training batches under ``root``, concatenated: (images (N, S, S, 3), labels (N,) 0-based)."""
    root = os.path.expanduser(root)
    missing = [name for name in TRAIN_FILES if not os.path.isfile(os.path.join(root, name))]
    if missing:
        raise FolderError(f"{root!r} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: "
                          f"expected the ten files train_data_batch_1..10 of Imagenet32_train.zip")
    parts = [read_batch(os.path.join(root, name)) for name in TRAIN_FILES]
    if len({p[0].shape[1:] for p in parts}) > 1:
        raise FolderError(f"the batches under {root!r} hold images of different sides")
    images = np.empty((sum(len(p[1]) for p in parts), *parts[0][0].shape[1:]), dtype=np.uint8)
    start = 0
    for x, y in parts:
        images[start:start + len(y)] = x
        start += len(y)
    return images, np.concatenate([p[1] for p in parts])


class ArrayBatches(Dataset):
    """Indexed by a list of image indices: ``{"images": uint8 (1, B, S, S, 3)}`` (+ ``"labels"``) cut from
    arrays in memory, the items of :class:`pretrain.folder.BatchDecoder`."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, labelled: bool):
        self.images, self.labels, self.labelled = images, labels, labelled

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        out = {"images": torch.from_numpy(self.images[indices][None])}
        if self.labelled:
            out["labels"] = torch.from_numpy(self.labels[indices])
        return out


class ImageNet32Source(FolderSource):
    """:class:`pretrain.folder.FolderSource` over down-sampled ImageNet held in memory: the same batch order
    for (seed, epoch), the same torchrun shares; classes are the 1,000 ids."""

    def __init__(self, cfg: FolderConfig, workers: int = 0):
        images, labels = read_imagenet32(cfg.root)
        if images.shape[1] != cfg.size:
            raise FolderError(f"the batches under {cfg.root!r} hold {images.shape[1]} px images; pass --size "
                              f"{images.shape[1]}")
        self.cfg, self.workers = cfg, 0  # in memory: nothing to decode in workers
        self.shard = (0, 1)
        n_classes = int(labels.max()) + 1
        self.classes = [str(i) for i in range(1, n_classes + 1)]  # the published 1-based ids
        self.n_images = len(labels)
        if cfg.drop_last and self.n_images < cfg.batch_size:
            raise FolderError(f"{self.n_images} images under {cfg.root!r} is fewer than one batch of "
                              f"{cfg.batch_size}; use a smaller --batch-size")
        self.dataset = ArrayBatches(images, labels, cfg.labelled)

    def fingerprint(self) -> dict:
        """What ``--resume`` compares: the image count and a sha256 of the ten files' names and sizes in bytes
        (contents are not read again)."""
        h, root = hashlib.sha256(), os.path.expanduser(self.cfg.root)
        for name in TRAIN_FILES:
            h.update(f"{name}\0{os.path.getsize(os.path.join(root, name))}\n".encode())
        return {"images": self.n_images, "images_sha256": h.hexdigest()}
