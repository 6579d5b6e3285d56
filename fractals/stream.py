"""An endless-but-sized stream of fractal batches for pre-training (Chen et al., ICLR 2023, §4.2).

The paper draws 1M FPS pairs per epoch on the fly. :class:`FractalStream` is an ``IterableDataset`` that
yields whole batches (use ``DataLoader(stream, batch_size=None)``). Batch i of epoch e is generated from
``SeedSequence([seed, e, i])`` and batches are dealt round-robin to DataLoader workers, so every worker has
its own stream (worker w makes batches w, w + W, ...), no two workers repeat each other, and the epoch's
content is the same whatever the number of workers.

Under DistributedDataParallel (``shard=(rank, world)``) every process draws batch i's whole parameters
(codes, per-scene seeds) from the same seed and renders only its rows :func:`shard_rows`, so the global
batches of an epoch are the same pairs, bit for bit, for any number of processes and workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fpsfl.base.images import AugmentConfig, Draws, apply, draw_for

from . import torch_render
from .ifs import CodeBank
from .scenes import SCENE_KINDS, RenderConfig

KINDS = tuple(SCENE_KINDS)
RENDERERS = ("numba", "torch")  # see StreamConfig.renderer


def shard_rows(n: int, rank: int, world: int) -> slice:
    """The rows [rank n / W, (rank + 1) n / W) of a global batch of n that process ``rank`` of W holds.
    n must be divisible by W, so every process holds as many rows (the loss and gradient averages over
    processes then equal those of the whole batch)."""
    if n % world:
        raise ValueError(f"a batch of {n} cannot be split evenly over {world} processes")
    return slice(rank * n // world, (rank + 1) * n // world)


def augment_views(images: torch.Tensor, n_views: int, cfg: AugmentConfig, generator: torch.Generator,
                  rows: tuple[int, int] | None = None, applier=None) -> torch.Tensor:
    """uint8 renders (V, B, S, S, 3) -> float views (n_views, B, 3, S, S): view v augments render v % V.
    ``rows = (start, total)``: the renders are rows of a larger batch (:func:`fpsfl.base.images.augment`).
    Every view's draws come first, in view order (the generator's stream is that of augmenting the views
    one after the other), then ``applier`` (default :func:`apply_views`; ``pretrain --compile`` gives its
    compiled form) makes the views from them."""
    return (applier or apply_views)(images, draw_views(images, n_views, cfg, generator, rows), cfg)


def draw_views(images: torch.Tensor, n_views: int, cfg: AugmentConfig, generator: torch.Generator,
               rows: tuple[int, int] | None = None) -> list[Draws]:
    """The draws of :func:`augment_views`, every view's in view order."""
    return [draw_for(images[v % len(images)], cfg, generator, rows) for v in range(n_views)]


def apply_views(images: torch.Tensor, draws: list[Draws], cfg: AugmentConfig,
                sync_free: bool | None = None) -> torch.Tensor:
    """The views of :func:`augment_views` from their draws; pure (see :func:`fpsfl.base.images.apply`)."""
    return torch.stack([apply(images[v % len(images)], d, cfg, sync_free=sync_free)
                        for v, d in enumerate(draws)])


@dataclass(frozen=True)
class StreamConfig:
    kind: str = "fps"  # fps | multilabel | single (paper Fig. 2c and the Table 6 baselines)
    batch_size: int = 256  # pairs (or images) per batch (Appendix A.2: 256)
    pairs_per_epoch: int = 1_000_000  # Appendix A.2: 1M pairs per epoch
    seed: int = 0
    n_classes: int = 1000  # multilabel only: J classes (Anderson & Farrell 2022)
    # numba: fractals.draw on the CPU (in DataLoader workers); torch: fractals.torch_render on the stream's
    # device (a GPU renders where the model trains), the paper look only, equal in distribution, not in bits
    renderer: str = "numba"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {RENDERERS}, got {self.renderer!r}")
        if self.batch_size <= 0 or self.pairs_per_epoch <= 0:
            raise ValueError("batch_size and pairs_per_epoch must be positive")


class FractalStream(IterableDataset):
    """Yields dicts of whole batches.

    Without ``augment``: ``{"images": uint8 (V, B, S, S, 3), "codes": int64 (B, I)}`` with V = 2 for FPS
    (the two views) and V = 1 otherwise; multilabel adds ``"labels"`` float32 (B, J).
    With ``augment`` (image-level augmentation on CPU, in the worker): ``"views"`` float32 (V', B, 3, S, S)
    replaces ``"images"``, with V' = 2 for fps and single (two augmentations of one image) and 1 for
    multilabel. On a GPU, leave ``augment`` unset and run :func:`fpsfl.base.images.augment` on the device.
    With ``shard = (rank, world)`` each batch holds only the process's rows (:func:`shard_rows`).
    With ``cfg.renderer == "torch"`` the images (or views) are tensors on ``device`` (default: CUDA when
    available); iterate such a stream in the training process, not in DataLoader workers (CUDA does not
    survive their fork). The codes and per-scene seeds are drawn as for numba, so the two renderers give the
    same codes and differ only in the scenes' randomness.
    """

    def __init__(self, bank: CodeBank, render: RenderConfig, cfg: StreamConfig,
                 augment_cfg: AugmentConfig | None = None, shard: tuple[int, int] = (0, 1),
                 device: torch.device | str | None = None):
        super().__init__()
        self.bank, self.render, self.cfg, self.augment_cfg = bank, render, cfg, augment_cfg
        self.shard = shard
        self.epoch = 0
        self.device = torch.device(device) if device is not None else None
        if cfg.renderer == "torch":
            torch_render.check_config(render)
            self.device = self.device or torch_render.default_device()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's stream; call before iterating (workers copy the dataset at iteration start)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return math.ceil(self.cfg.pairs_per_epoch / self.cfg.batch_size)

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        """Batch ``index`` of the current epoch; a pure function of (seed, epoch, index)."""
        cfg = self.cfg
        n = min(cfg.batch_size, cfg.pairs_per_epoch - index * cfg.batch_size)
        if n <= 0:
            raise IndexError(f"batch {index} is past the end of the epoch ({len(self)} batches)")
        rows = shard_rows(n, *self.shard)
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, self.epoch, index]))
        kind = SCENE_KINDS[cfg.kind]
        by = {"render": partial(torch_render.render_batch, device=self.device)} if cfg.renderer == "torch" \
            else {}
        images, codes, labels = kind.make(self.bank, self.render, n, rng, cfg.n_classes, rows, **by)
        images = images if isinstance(images, torch.Tensor) else torch.from_numpy(images)
        out = {"codes": torch.from_numpy(np.asarray(codes, np.int64))}
        if labels is not None:
            out["labels"] = torch.from_numpy(labels)
        if self.augment_cfg is None:
            out["images"] = images
        else:
            gen = torch.Generator(device=images.device).manual_seed(int(rng.integers(0, 2**62)))
            out["views"] = augment_views(images, kind.views, self.augment_cfg, gen, (rows.start, n))
        return out

    def __iter__(self):
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            torch.set_num_threads(1)  # one core per worker: the workers are the parallelism
        for index in range(worker, len(self), n_workers):
            yield self.batch(index)
