"""Fixed-size uint8 batches from an image folder, for pre-training on real or generated images.

Chen et al. (ICLR 2023) compare fractal pre-training with pre-training on other sources (§4.2, §4.5): an
unlabelled folder of images (e.g. StyleGAN-generated) for self-supervised learning, and a labelled
``ROOT/<class>/<image>`` tree (ImageNet-32, or a Places365 stand-in) for cross-entropy pre-training.
:class:`FolderSource` only decodes: every image is resized (shorter side to ``size``, bilinear, antialiased)
and centre-cropped to ``size`` x ``size``; random crops and the other augmentations run later, batched on
the device (:mod:`fpsfl.base.images`).

The order of epoch e is ``torch.randperm`` under ``SeedSequence([seed, e])`` and the DataLoader keeps batch
order, so the batches of (seed, epoch) are the same whatever the number of workers. Under torchrun
(``shard = (rank, world)``) every process draws the same permutation and decodes only its rows of each
global batch (the contiguous blocks of :func:`fractals.stream.shard_rows`, as the fractal stream renders
them), so the processes' shares of an epoch are disjoint, cover it, and in rank order are the one-process
batches.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fpsfl.base.images import pil_rgb

# torchvision.datasets.folder.IMG_EXTENSIONS, copied so that importing this module does not import
# torchvision (~0.4 s); tests/test_folder.py checks that the two agree.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class FolderError(ValueError):
    """A one-line, user-facing problem with the image folder; the CLI prints it and exits 2."""


@dataclass(frozen=True)
class FolderConfig:
    root: str  # folder of images (unlabelled) or of class folders (labelled)
    size: int  # px, side of the square output images
    batch_size: int = 256  # images per batch (Appendix A.2: 256)
    labelled: bool = False  # True: ROOT/<class>/<file> with class labels; False: every image under ROOT
    seed: int = 0  # with the epoch, fixes the order of the epoch's images
    drop_last: bool = True  # training batches have a fixed size (BatchNorm / memory bank)

    def __post_init__(self) -> None:
        if self.size <= 0 or self.batch_size <= 0:
            raise FolderError(f"size and batch size must be positive, got {self.size} and {self.batch_size}")
        if self.seed < 0:
            raise FolderError(f"seed must be non-negative, got {self.seed}")


def is_image(name: str) -> bool:
    """torchvision's ``has_file_allowed_extension(name, IMG_EXTENSIONS)``."""
    return name.lower().endswith(IMG_EXTENSIONS)


def walk_images(directory: str) -> list[str]:
    """Image files under ``directory`` in torchvision's ``make_dataset`` order (sorted walk, sorted names).

    Links are followed, but each real folder is entered once and each real file listed once: a link to a
    folder above it (``ln -s . ROOT/a/self``) would list the tree again at every level of the loop, and two
    such links would walk for ever. Of a folder's several paths the first in a sorted walk is kept."""
    folders, entered = [], set()
    for root, dirs, names in os.walk(directory, followlinks=True):
        dirs.sort()  # which path of a linked folder is kept does not depend on the listing order
        real = os.path.realpath(root)
        if real in entered:
            dirs.clear()
            continue
        entered.add(real)
        folders.append((root, real, names))
    paths, listed = [], set()
    for root, real, names in sorted(folders):
        for name in sorted(names):
            if not is_image(name):
                continue
            path = os.path.join(root, name)
            try:  # os.walk hands on a name that is not UTF-8 with escapes; every later print would fail
                path.encode()
            except UnicodeEncodeError:
                shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                raise FolderError(f"{shown!r}: a file name that is not valid UTF-8; rename it") from None
            key = os.path.realpath(path) if os.path.islink(path) else os.path.join(real, name)
            if key not in listed:
                listed.add(key)
                paths.append(path)
    return paths


def scan(cfg: FolderConfig) -> tuple[list[str], list[int], list[str]]:
    """(paths, labels, classes) with torchvision ``find_classes`` / ``make_dataset`` semantics.

    Labelled: the classes are the sorted sub-folders of ROOT (class index = position), files directly in ROOT
    are ignored and a class folder without images is an error. Unlabelled: every image under ROOT, label 0.
    """
    root = os.path.expanduser(cfg.root)
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise FolderError(f"image folder {cfg.root!r} {what}")
    accepted = f"accepted extensions: {' '.join(IMG_EXTENSIONS)} (any case)"
    if not cfg.labelled:
        paths = walk_images(root)
        if not paths:
            raise FolderError(f"no images found under {cfg.root!r}; {accepted}")
        return paths, [0] * len(paths), []
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if len(classes) < 2:
        raise FolderError(f"a labelled folder needs at least 2 class folders ROOT/<class>/<image>, "
                          f"found {len(classes)} in {cfg.root!r}")
    paths, labels, empty = [], [], []
    for index, name in enumerate(classes):
        found = walk_images(os.path.join(root, name))
        paths += found
        labels += [index] * len(found)
        if not found:
            empty.append(name)
    if empty:
        raise FolderError(f"class folders without images in {cfg.root!r}: {', '.join(empty)}; {accepted}")
    return paths, labels, classes


def _header_problem(path: str) -> str | None:
    """Why ``path`` is not an image PIL can open (header only: cheap), or None."""
    try:
        with Image.open(path) as img:
            img.size  # noqa: B018 (the header is parsed here)
    except Exception as e:  # any failure means the file cannot be trained on
        return f"{type(e).__name__}: {e}".replace("\n", " ")
    return None


def check_headers(paths: list[str], threads: int = 8) -> None:
    """Open every image's header (in ``threads`` threads: the work is I/O) so that an unreadable file is
    reported before training, not epochs later when a shuffle first reaches it (a drop-last batch may skip
    it for many epochs). A file whose body is damaged is still named when it is decoded."""
    with ThreadPoolExecutor(threads) as pool:
        problems = [(p, why) for p, why in zip(paths, pool.map(_header_problem, paths, chunksize=256),
                                               strict=True) if why]
    if problems:
        path, why = problems[0]
        raise FolderError(f"{len(problems)} of {len(paths)} images cannot be opened, e.g. {path!r} ({why}); "
                          f"remove or replace them")


def load_image(path: str, size: int) -> np.ndarray:
    """uint8 (size, size, 3): RGB, shorter side resized to ``size`` (bilinear, antialiased), centre crop.

    Matches torchvision's ``Resize(size)`` + ``CenterCrop(size)`` on the PIL image, except that a JPEG is
    first decoded at the smallest DCT scale (1/2, 1/4, 1/8) that keeps both sides >= ``size`` (``draft``):
    a large speed-up for small outputs, itself an antialiased (block-averaging) downscale.
    """
    try:
        with Image.open(path) as img:
            img.draft("RGB", (size, size))
            img = pil_rgb(img)  # 16-bit grey scaled, transparency on black
            w, h = img.size
            # torchvision's rule: the shorter side becomes size, the longer int(size * long / short)
            new_w, new_h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
            if (new_w, new_h) != (w, h):
                img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
            left, top = int(round((new_w - size) / 2)), int(round((new_h - size) / 2))
            img = img.crop((left, top, left + size, top + size))
            return np.asarray(img, dtype=np.uint8)
    except Exception as e:  # any failure to decode is a problem with this file, reported as such
        raise FolderError(f"cannot read image {path!r}: {type(e).__name__}: {e}".replace("\n", " ")) from e


class BatchDecoder(Dataset):
    """Indexed by a list of image indices; returns the whole decoded batch (one worker decodes one batch):
    ``{"images": uint8 (1, B, S, S, 3)}`` (+ ``"labels"``), or ``{"error": message}`` for an unreadable file.
    Also the decoder of ``federate``'s streamed datasets (:mod:`federated.datasets.stream`).

    The paths live in one byte buffer plus offsets rather than a list of str: forked workers reading a
    Python list touch refcounts and so copy its pages, which for ~1M paths costs ~100 MB per worker.
    """

    def __init__(self, paths: list[str], labels: list[int], size: int, labelled: bool):
        encoded = [os.fsencode(p) for p in paths]
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.offsets = np.cumsum([0] + [len(p) for p in encoded], dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.size, self.labelled = size, labelled

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        return os.fsdecode(self.blob[self.offsets[i]:self.offsets[i + 1]].tobytes())

    def __getitem__(self, indices: list[int]) -> dict[str, torch.Tensor | str]:
        images = np.empty((1, len(indices), self.size, self.size, 3), dtype=np.uint8)  # (1, B, S, S, 3)
        try:
            for b, i in enumerate(indices):
                images[0, b] = load_image(self.path(i), self.size)
        except FolderError as e:
            # sent back as data: a worker's exception would reach the caller wrapped in a multi-line traceback
            return {"error": str(e)}
        out: dict[str, torch.Tensor | str] = {"images": torch.from_numpy(images)}
        if self.labelled:
            out["labels"] = torch.from_numpy(self.labels[indices])  # (B,)
        return out


def identity(batch: dict) -> dict:
    """The DataLoader collate of :class:`BatchDecoder`, whose items are already whole batches."""
    return batch


class FolderSource:
    """Batches ``{"images": uint8 (1, B, S, S, 3)}`` (+ ``"labels"`` int64 (B,) when labelled) from a folder.

    The leading 1 is the number of renders, as in :class:`fractals.stream.FractalStream`; the training loop
    makes its views from it. Scanning happens here, so folder problems surface before training starts.
    """

    def __init__(self, cfg: FolderConfig, workers: int = 0):
        if workers < 0:
            raise FolderError(f"workers must be non-negative, got {workers}")
        self.cfg, self.workers = cfg, workers
        self.shard = (0, 1)  # (rank, world): this process decodes its rows of every global batch
        paths, labels, self.classes = scan(cfg)
        check_headers(paths)
        self.n_images = len(paths)
        if cfg.drop_last and self.n_images < cfg.batch_size:
            raise FolderError(f"{self.n_images} images in {cfg.root!r} is fewer than one batch of "
                              f"{cfg.batch_size}; use a smaller --batch-size")
        self.dataset = BatchDecoder(paths, labels, cfg.size, cfg.labelled)

    def __len__(self) -> int:
        n, b = self.n_images, self.cfg.batch_size
        return n // b if self.cfg.drop_last else math.ceil(n / b)

    def fingerprint(self) -> dict:
        """The image list for ``--resume`` to compare: a sha256 of every image's path under the root (its
        class folder included) and size in bytes, in the scan's order; contents are not read (a resume
        would read the whole folder), so an image edited in place to the same size goes unnoticed."""
        root, data = os.path.expanduser(self.cfg.root), self.dataset
        h = hashlib.sha256()
        for i in range(len(data)):
            path = data.path(i)
            h.update(f"{os.path.relpath(path, root)}\0{os.path.getsize(path)}\n".encode())
        return {"images": len(data), "images_sha256": h.hexdigest()}

    def order(self, epoch: int) -> list[list[int]]:
        """The image indices of each batch of ``epoch``: a pure function of (seed, epoch)."""
        state = np.random.SeedSequence([self.cfg.seed, epoch]).generate_state(1, np.uint64)[0]
        perm = torch.randperm(self.n_images, generator=torch.Generator().manual_seed(int(state))).tolist()
        b = self.cfg.batch_size
        return [perm[k * b:(k + 1) * b] for k in range(len(self))]

    def my_order(self, epoch: int) -> list[list[int]]:
        """This process's rows of each batch of :meth:`order` (all of them without a shard)."""
        rank, world = self.shard  # fractals.stream.shard_rows, not imported: it loads numba, which federate's
        # start-up must not (federated.datasets decodes folders with this module; pyproject's contracts)
        return [batch[rank * len(batch) // world:(rank + 1) * len(batch) // world]
                for batch in self.order(epoch)]

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of ``epoch`` in order; raises :class:`FolderError` on the first unreadable image."""
        loader = DataLoader(self.dataset, batch_size=None, sampler=self.my_order(epoch),
                            num_workers=self.workers, collate_fn=identity, pin_memory=False)
        for batch in loader:
            if "error" in batch:
                raise FolderError(batch["error"])
            yield batch
