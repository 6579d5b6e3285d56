"""Images that stay files until a batch needs them: the path for datasets too large to hold in memory.

Chen et al., ICLR 2023 fine-tune on iNaturalist-GEO at 224 px (§4.2, Table 1: 120K training and 36K test
images): 18 GB of training images as one uint8 array. :class:`StreamedImages` stands where a uint8
tensor (N, S, S, 3) would: it has the tensor's ``shape``, ``dtype``, ``device`` and ``len``; indexing it
decodes those rows now; :func:`fetch` decodes a whole list of batches ahead of use with DataLoader worker
processes, as torchvision's ImageFolder users do (each worker decodes one batch,
:class:`pretrain.folder.BatchDecoder`: shorter side to S, bilinear and antialiased, centre crop). The
images decode to exactly the bytes the in-memory path holds, so a run gives the same result either way.

Whether a dataset streams (``federate --decode``): ``memory`` holds it, ``stream`` streams it, ``auto`` (the
default) streams a folder dataset whose stored images would take more than half the memory available, and
iNaturalist-GEO always (its reader asks for it). CIFAR, Tiny-ImageNet and digits stay in memory under auto.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from pretrain.folder import BatchDecoder, identity

from .decode import DataError, Loaded, _labels, check_headers, decode_images, decode_parallel

DECODE_MODES = ("auto", "memory", "stream")
MEMORY_SHARE = 0.5  # auto streams when the stored images would take more than this share of available memory
MAX_WORKERS = 8  # DataLoader decoding processes (fewer on smaller machines: one per core)
PREFETCH = 4  # batches each worker decodes ahead


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable of /proc/meminfo; all physical memory elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def wants_stream(mode: str, n_images: int, size: int, large: bool = False) -> bool:
    """Whether ``n_images`` images stored at ``size`` px stream under ``--decode mode``; ``large``: the
    dataset streams under auto whatever the memory (iNaturalist-GEO)."""
    if mode not in DECODE_MODES:
        raise DataError(f"--decode must be one of {', '.join(DECODE_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode == "stream"
    return large or n_images * size * size * 3 > MEMORY_SHARE * available_memory()


@dataclass(frozen=True)
class StreamedImages:
    """uint8 images (N, S, S, 3), channels-last, decoded from their files when indexed.

    ``decoder`` holds every path of the split once; ``rows`` (int64) are the positions this view holds, so
    subsets (the validation split, a client) share the decoder. Decoded batches land on ``device``.
    """

    decoder: BatchDecoder
    rows: np.ndarray  # int64 (N,): positions in the decoder
    device: torch.device = torch.device("cpu")
    workers: int = dataclasses.field(default_factory=lambda: min(MAX_WORKERS, os.cpu_count() or 1))

    @classmethod
    def from_paths(cls, paths: list[str], size: int) -> StreamedImages:
        return cls(BatchDecoder(paths, [0] * len(paths), size, labelled=False), np.arange(len(paths)))

    dtype = torch.uint8
    ndim = 4

    @property
    def size(self) -> int:
        return self.decoder.size

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows), self.size, self.size, 3))

    def __len__(self) -> int:
        return len(self.rows)

    def to(self, device: torch.device | str) -> StreamedImages:
        return dataclasses.replace(self, device=torch.device(device))

    def cpu(self) -> StreamedImages:
        return self.to("cpu")

    def subset(self, index) -> StreamedImages:
        """The images at ``index`` (positions in this view), still as files."""
        return dataclasses.replace(self, rows=self.rows[_positions(index, len(self))])

    def __getitem__(self, index) -> Tensor:
        """The images at ``index`` (an int, a slice or an index array), decoded now on a thread pool."""
        if isinstance(index, int):
            return self[[index]][0]
        rows = self.rows[_positions(index, len(self))]
        out = np.empty((len(rows), self.size, self.size, 3), dtype=np.uint8)

        def fill(i: int) -> None:
            out[i] = self._decode([int(rows[i])])[0, 0]

        decode_parallel(len(rows), fill, desc="decode")
        return torch.from_numpy(out).to(self.device)

    def batches(self, indices: Iterable) -> Iterator[Tensor]:
        """The images of each entry of ``indices`` (positions in this view) in order, decoded ahead by
        ``workers`` DataLoader processes."""
        order = [self.rows[_positions(index, len(self))].tolist() for index in indices]
        loader = DataLoader(self.decoder, batch_size=None, sampler=order, num_workers=self.workers,
                            collate_fn=identity, pin_memory=self.device.type == "cuda",
                            prefetch_factor=PREFETCH if self.workers else None)
        for batch in loader:
            if "error" in batch:
                raise DataError(batch["error"])
            yield batch["images"][0].to(self.device, non_blocking=True)

    def _decode(self, rows: list[int]) -> np.ndarray:
        batch = self.decoder[rows]
        if "error" in batch:
            raise DataError(batch["error"])
        return batch["images"].numpy()


def _positions(index, n: int) -> np.ndarray:
    """An int64 position array from a slice, a tensor, an array or a list."""
    if isinstance(index, slice):
        return np.arange(n)[index]
    if isinstance(index, Tensor):
        return index.detach().cpu().numpy().astype(np.int64)
    return np.asarray(index, dtype=np.int64)


def fetch(x: Tensor | StreamedImages, indices: Iterable) -> Iterator[Tensor]:
    """``x[index]`` for every entry of ``indices`` (index tensors or slices), in order: indexing for a tensor,
    decoding ahead with worker processes for :class:`StreamedImages`."""
    if isinstance(x, StreamedImages):
        yield from x.batches(indices)
        return
    indices = list(indices)
    if all(isinstance(index, Tensor) for index in indices):
        indices = on_device(indices, x.device)
    for index in indices:
        yield x[index]


def on_device(indices: list[Tensor], device: torch.device) -> list[Tensor]:
    """The index tensors on ``device``, moved with one host-to-device copy for all of them rather than one a
    training step (each would make the host wait for the device, issue 40)."""
    if not indices or all(index.device == device for index in indices):
        return list(indices)
    return list(torch.cat(indices).to(device).split([len(index) for index in indices]))


def take(x: Tensor | StreamedImages, index: Tensor) -> Tensor | StreamedImages:
    """``x[index]``, kept as files for :class:`StreamedImages`."""
    return x.subset(index) if isinstance(x, StreamedImages) else x[index]


def chunks(x: Tensor | StreamedImages, y: Tensor, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """(images, labels) of consecutive ``batch_size`` rows of (x, y), e.g. for evaluation; streamed images
    are decoded ahead."""
    slices = [slice(start, start + batch_size) for start in range(0, len(x), batch_size)]
    for sl, images in zip(slices, fetch(x, slices), strict=True):
        yield images, y[sl]


def decode_split(name: str, train: tuple[list[str], list[int]], test: tuple[list[str], list[int]],
                 classes: list[str], size: int, workers: int | None = None,
                 clients: list[int] | None = None, stream: bool = False) -> Loaded:
    """The :class:`Loaded` of a dataset given as (paths, labels) of its train and test images; with
    ``stream`` the images stay files (:class:`StreamedImages`), whose headers are
    checked now so that an unreadable file is named before training."""
    if stream:
        check_headers(train[0] + test[0])
        images = (StreamedImages.from_paths(train[0], size), StreamedImages.from_paths(test[0], size))
    else:
        images = (decode_images(train[0], size, workers, f"{name} train"),
                  decode_images(test[0], size, workers, f"{name} test"))
    return Loaded(images[0], _labels(train[1]), images[1], _labels(test[1]), classes,
                  None if clients is None else _labels(clients))
