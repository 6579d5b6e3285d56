"""What the dataset readers of :mod:`federated.datasets` share: the arrays they return, their errors, and
threaded decoding of image files.

Chen et al., ICLR 2023, §4.2 and §4.5 fine-tune in federated learning on CIFAR-10/100, Tiny-ImageNet,
iNaturalist-GEO (the geographic client splits of Hsu et al., ECCV 2020) and a labelled image folder (e.g. the
chest X-rays of §4.5); Table 5 segments Cityscapes. Each reader takes explicit arguments and returns a
:class:`Loaded`: images uint8 (N, S, S, 3) channels-last (as the fractal renderer writes them) at the stored
side S, int64 labels, and the class names; for Cityscapes images (N, H, W, 3) and uint8 train-id label maps
(N, H, W). :mod:`federated.datasets` wraps them in its registry and splits off validation data.

Folder images are decoded with :func:`pretrain.folder.load_image` (shorter side resized to S, bilinear,
antialiased, centre crop) on a thread pool: PIL releases the GIL while decoding and resizing. The names
starting with ``_`` are private to the package: its reader modules share them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pretrain.folder import FolderError, load_image
from pretrain.folder import check_headers as _check_headers

DECODE_CHUNK = 256  # images per thread-pool task: few enough tasks to keep the pool's queue small
PROGRESS_MIN = 1000  # images: a progress bar is shown when decoding more


class DataError(ValueError):
    """A one-line, user-facing problem with a dataset; the CLI prints it and exits 2."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))  # one line, whatever was interpolated


class Loaded(NamedTuple):
    train_x: torch.Tensor  # uint8 (N, S, S, 3); segmentation: (N, H, W, 3)
    train_y: torch.Tensor  # int64 (N,); segmentation: uint8 (N, H, W) train ids, 255 ignored
    test_x: torch.Tensor  # uint8 (M, S, S, 3); segmentation: (M, H, W, 3)
    test_y: torch.Tensor  # int64 (M,); segmentation: uint8 (M, H, W)
    classes: list[str]
    clients: torch.Tensor | None = None  # int64 (N,) natural client of each training image, 0..K-1


def _labels(values: list[int]) -> torch.Tensor:
    """int64 (N,) labels (or client ids) from a list, as every reader returns them."""
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1))


def resize_uint8(x: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> uint8 (N, size, size, 3), bilinear, antialiased when shrinking; in chunks."""
    if x.shape[1] == size and x.shape[2] == size:
        return x
    out = torch.empty((x.shape[0], size, size, 3), dtype=torch.uint8)
    for i in range(0, x.shape[0], chunk):
        xs = x[i:i + chunk].permute(0, 3, 1, 2).float()
        ys = F.interpolate(xs, size=(size, size), mode="bilinear", align_corners=False,
                           antialias=size < x.shape[1])
        out[i:i + chunk] = ys.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    return out


def decode_parallel(n: int, fill: Callable[[int], None], workers: int | None = None,
                    desc: str = "decode") -> None:
    """Call ``fill(i)`` for i in range(n) on ``workers`` threads (default: CPUs, <= 16), in chunks, with a
    progress bar above PROGRESS_MIN images. The first error stops the rest; a FolderError becomes a
    DataError."""
    workers = workers or min(16, os.cpu_count() or 1)
    step = max(1, min(DECODE_CHUNK, n // (4 * workers)))  # >= 4 tasks a thread for few, large images

    def chunk(start: int) -> int:
        stop = min(start + step, n)
        for i in range(start, stop):
            fill(i)
        return stop - start

    with ThreadPoolExecutor(workers) as pool, tqdm(total=n, desc=desc, unit="img",
                                                    disable=n <= PROGRESS_MIN) as bar:
        try:
            for done in pool.map(chunk, range(0, n, step)):
                bar.update(done)
        except (FolderError, DataError) as e:
            pool.shutdown(cancel_futures=True)  # stop at the first unreadable file, not after all the rest
            raise DataError(str(e)) from e


def decode_images(paths: list[str], size: int, workers: int | None = None,
                  desc: str = "decode") -> torch.Tensor:
    """uint8 (N, size, size, 3) from image files, decoded on ``workers`` threads (default: CPUs, <= 16)."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)

    def fill(i: int) -> None:
        out[i] = load_image(paths[i], size)

    decode_parallel(len(paths), fill, workers, desc)
    return torch.from_numpy(out)


def check_headers(paths: list[str]) -> None:
    """:func:`pretrain.folder.check_headers` as a DataError."""
    try:
        _check_headers(paths)
    except FolderError as e:
        raise DataError(str(e)) from e


def _require_dir(path: str, what: str) -> None:
    if not os.path.isdir(path):
        problem = "is not a directory" if os.path.exists(path) else "does not exist"
        raise DataError(f"{what}: {path!r} {problem}")


def _read_text(path: str, what: str) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped, line ends kept), or a one-line
    DataError naming the file and the first byte that is not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{what}: cannot read {path!r}: {e.strerror or e}") from e
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{what}: {path!r} is not UTF-8 text (byte {e.start}: "
                        f"{data[e.start:e.start + 1]!r}); save it as UTF-8") from None


def _is_int(value: str) -> bool:
    """Whether ``value`` is an integer of at most 18 ASCII digits, as ``int`` reads it (not "²", not "--1",
    not 5,000 digits, which ``int`` refuses)."""
    return re.fullmatch(r"-?[0-9]{1,18}", value) is not None


def _ids(values: list[str]) -> tuple[list[int], list[str]]:
    """Map values to 0..K-1 in sorted order (numeric when all are integers); returns (indices, names).

    Natural clients (iNat-GEO users, Cityscapes cities) get ids that do not depend on the file order."""
    unique = set(values)
    numeric = all(_is_int(v) for v in unique)
    names = sorted(unique, key=int) if numeric else sorted(unique)
    index = {v: i for i, v in enumerate(names)}
    return [index[v] for v in values], names
