"""Pre-training data sources, looked up by name (Chen et al., ICLR 2023, §4.2, §4.5, Table 6).

A source yields batches ``{"images": uint8 (V, B, S, S, 3)}`` (V rendered views) plus ``"labels"`` for the
supervised kinds. The training loop moves them to the device and makes the method's augmented views there,
so the CPU side only renders or decodes.

- ``fps``: FPS pairs rendered on the fly, two views per pair (§4.2).
- ``fractal-single``: one fractal per image, both views from image-level augmentation ("fractal + SimSiam").
- ``multilabel``: multi-label fractal images over J codes (Anderson & Farrell 2022).
- ``images``: any image folder, two augmented views (e.g. StyleGAN-generated images, Table 6).
- ``supervised``: a labelled ``ROOT/<class>/`` folder, or down-sampled ImageNet 32 x 32 in its published
  pickles (``--format imagenet32``, :mod:`pretrain.imagenet32`): the ResNet20 "ImageNet" init of §4.2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from fpsfl.base.files import file_sha256
from fpsfl.base.registry import Registry
from fractals.ifs import bank_or_sample
from fractals.scenes import RenderConfig
from fractals.stream import FractalStream, StreamConfig

from .folder import FolderConfig, FolderSource
from .imagenet32 import ImageNet32Source
from .methods import METHODS
from .recipe import PretrainConfig

HELD_OUT_EPOCH = 2**31 - 1  # the stream's epoch index of the held-out batch (runs have fewer epochs)


def renderer_for(cfg: PretrainConfig, device: torch.device) -> tuple[str, torch.device | None]:
    """The renderer of ``--renderer`` and, for torch, its device: the device this process trains on
    (``--device``; cuda:LOCAL_RANK under torchrun). auto is torch when that is a GPU (the paper look only: the
    sparse look is numba's), numba otherwise, so a CPU run renders as before; an explicit torch renders on the
    training device, the CPU included."""
    name = cfg.renderer
    if name == "auto":
        name = "torch" if device.type == "cuda" and cfg.look == "paper" else "numba"
    return (name, None) if name == "numba" else (name, device)


class _EpochBatches(Dataset):
    """Batch ``(epoch, index)`` of a stream, a pure function of both (:meth:`FractalStream.batch`): a
    map-style view, so that one DataLoader with persistent workers serves every epoch, the epoch named by the
    sampler, which runs in the training process."""

    def __init__(self, stream: FractalStream):
        self.stream = stream

    def __len__(self) -> int:
        return len(self.stream)

    def __getitem__(self, key: tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, index = key
        self.stream.set_epoch(epoch)  # this worker's copy of the stream
        return self.stream.batch(index)


class _EpochOrder(Sampler):
    """The batches of epoch ``epoch`` in order; set ``epoch`` before each pass."""

    def __init__(self, n: int):
        self.n, self.epoch = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, i) for i in range(self.n))


def _one_thread(worker: int) -> None:
    torch.set_num_threads(1)  # one core per renderer process: the processes are the parallelism


class FractalSource:
    """A :class:`FractalStream` of one scene kind, rendered in this process (the torch renderer, or numba
    without workers) or by ``workers`` numba processes that live for the whole run (started once, not once
    an epoch) and hand over page-locked batches when the run trains on a GPU (issue 40)."""

    def __init__(self, cfg: PretrainConfig, kind: str, workers: int, device: torch.device):
        bank = bank_or_sample(cfg.bank, cfg.seed)
        renderer, render_device = renderer_for(cfg, device)
        stream_cfg = StreamConfig(kind=kind, batch_size=cfg.batch_size, pairs_per_epoch=cfg.pairs_per_epoch,
                                  seed=cfg.seed, n_classes=cfg.n_classes, renderer=renderer)
        render = RenderConfig.preset(cfg.size, look=cfg.look, instances=cfg.instances, colours=cfg.colours,
                                     flips=cfg.flips == "own")
        self.stream = FractalStream(bank, render, stream_cfg, device=render_device)
        self.workers, self.pin_memory = workers, device.type == "cuda"
        self.n_classes = cfg.n_classes if kind == "multilabel" else None
        self.bank_path = cfg.bank
        self._loader: DataLoader | None = None
        self._order: _EpochOrder | None = None

    def fingerprint(self) -> dict:
        """What decides the data beyond the config, for ``--resume`` to compare: the bank file's sha256 (a
        regenerated bank at the same path is other data); a bank sampled from --seed has none. The torch
        renderer draws other scenes than numba's: it is recorded, so a run does not resume with the other."""
        torch_drawn = {"renderer": "torch"} if self.stream.cfg.renderer == "torch" else {}
        return {"bank_sha256": file_sha256(self.bank_path), **torch_drawn} if self.bank_path else torch_drawn

    def __len__(self) -> int:
        return len(self.stream)

    def shard(self, rank: int, world: int) -> None:
        """Render only process ``rank``'s rows of every global batch (:func:`fractals.stream.shard_rows`)."""
        if self._loader is not None:
            raise RuntimeError("shard the source before its first epoch (its workers hold the stream)")
        self.stream.shard = (rank, world)

    def held_out(self, n: int) -> torch.Tensor:
        """uint8 renders (V, n, S, S, 3) of a fixed batch no epoch trains on (an epoch index beyond any
        run's), whatever the process count: the batch RankMe is measured on."""
        cfg = dataclasses.replace(self.stream.cfg, batch_size=n, pairs_per_epoch=n)
        stream = FractalStream(self.stream.bank, self.stream.render, cfg, device=self.stream.device)
        stream.set_epoch(HELD_OUT_EPOCH)
        return stream.batch(0)["images"]

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        if self.stream.cfg.renderer == "torch" or not self.workers:  # in this process (no forked CUDA)
            self.stream.set_epoch(epoch)
            yield from self.stream
            return
        if self._loader is None:  # the same batches, in the same order, as iterating the stream
            self._order = _EpochOrder(len(self.stream))
            self._loader = DataLoader(_EpochBatches(self.stream), batch_size=None, sampler=self._order,
                                      num_workers=self.workers, pin_memory=self.pin_memory, prefetch_factor=4,
                                      persistent_workers=True, worker_init_fn=_one_thread)
        self._order.epoch = epoch
        yield from self._loader


class ImageSource:
    """An image folder (:class:`pretrain.folder.FolderSource`) or down-sampled ImageNet's pickles
    (:class:`pretrain.imagenet32.ImageNet32Source`), with labels or without."""

    def __init__(self, cfg: PretrainConfig, labelled: bool, workers: int):
        if not cfg.root:
            raise ValueError(f"source {cfg.source!r} needs --root DIR (an image folder)")
        folder = FolderConfig(root=cfg.root, size=cfg.size, batch_size=cfg.batch_size, labelled=labelled,
                              seed=cfg.seed)
        kind = ImageNet32Source if cfg.format == "imagenet32" else FolderSource
        self.folder = kind(folder, workers=workers)
        self.n_classes = len(self.folder.classes) if labelled else None

    def fingerprint(self) -> dict:
        """What ``--resume`` compares: the folder's image list (:meth:`FolderSource.fingerprint`), or
        down-sampled ImageNet's pickles (:meth:`ImageNet32Source.fingerprint`)."""
        return self.folder.fingerprint()

    def __len__(self) -> int:
        return len(self.folder)

    def shard(self, rank: int, world: int) -> None:
        """Decode only process ``rank``'s rows of every global batch (see :mod:`pretrain.folder`)."""
        self.folder.shard = (rank, world)

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        return self.folder.batches(epoch)


@dataclass(frozen=True)
class SourceSpec:
    """A pre-training source, registered in :data:`SOURCES`. Which methods can train on it is not listed
    here but derived (issue 39): a method fits when the labels it reads (:attr:`Method.labels`) are what the
    source's batches carry, so a new method is one file under ``pretrain/methods/``."""

    name: str
    make: Callable[[PretrainConfig, int, torch.device], FractalSource | ImageSource]  # (config, workers,
    # training device) -> source
    labels: str | None  # what its batches carry beside the images: None, "multihot" or "class"
    default_method: str
    description: str
    groups: tuple[str, ...]  # the PretrainConfig setting groups it uses (their flags show on its command)
    command: str = ""  # its `pretrain` subcommand when that is not its name

    @property
    def methods(self) -> tuple[str, ...]:
        """The registered methods that read this source's labels; the default first."""
        fit = [name for name, method in METHODS.items() if method.labels == self.labels]
        return (self.default_method, *[m for m in fit if m != self.default_method])

    @property
    def cli_name(self) -> str:
        return self.command or self.name

    @property
    def rendered(self) -> bool:
        """Fractals rendered on the fly (an epoch is --pairs-per-epoch), not a folder read once an epoch."""
        return "fractal" in self.groups


SOURCES: Registry[SourceSpec] = Registry("source")
for _spec in (
    SourceSpec("fps", lambda c, w, d: FractalSource(c, "fps", w, d), None, "simsiam",
               "FPS pairs rendered on the fly (§4.2)", ("fractal",)),
    SourceSpec("fractal-single", lambda c, w, d: FractalSource(c, "single", w, d), None, "simsiam",
               "one fractal per image, two augmented views (Table 6 baseline)", ("fractal",),
               command="fractal-simsiam"),
    SourceSpec("multilabel", lambda c, w, d: FractalSource(c, "multilabel", w, d), "multihot", "multilabel",
               "multi-label fractal images over J codes (Anderson & Farrell 2022)",
               ("fractal", "multilabel")),
    SourceSpec("images", lambda c, w, d: ImageSource(c, False, w), None, "simsiam",
               "any image folder, two augmented views (e.g. StyleGAN images)", ("folder",)),
    SourceSpec("supervised", lambda c, w, d: ImageSource(c, True, w), "class", "supervised",
               "a labelled ROOT/<class>/ image folder, or down-sampled ImageNet's pickles "
               "(--format imagenet32), cross-entropy (§4.2)", ("folder",)),
):
    SOURCES.register(_spec)
