"""A labelled image folder ``ROOT/{train,test}/<class>/<image>``: the medical images (e.g. chest X-rays) of
Chen et al., ICLR 2023, §4.5, fine-tuned at 224 px with ResNet18."""

from __future__ import annotations

import os
import sys
from collections import Counter

from PIL import Image

from pretrain.folder import FolderConfig, FolderError, is_image, scan

from . import DataConfig, Preset, register_dataset
from .decode import DataError, Loaded, _require_dir
from .stream import decode_split, wants_stream

SIDE_SAMPLE = 1000  # image headers read for the usual side: a mode is clear long before, ~1 s on a slow disk


def read_imagefolder(root: str, size: int, workers: int | None = None, decode: str = "auto") -> Loaded:
    """``ROOT/{train,test}/<class>/<image>`` (e.g. chest X-rays, §4.5); classes: the sorted train folders."""
    root = os.path.expanduser(root)
    _require_dir(root, "imagefolder root (--data-root)")
    for part in ("train", "test"):
        _require_dir(os.path.join(root, part), f"imagefolder expects ROOT/{part}/<class>/<image>")
    try:
        parts = {part: scan(FolderConfig(root=os.path.join(root, part), size=size, labelled=True))
                 for part in ("train", "test")}
    except FolderError as e:
        raise DataError(f"imagefolder: {e}") from e
    (train_paths, train_labels, classes), (test_paths, test_labels, test_classes) = parts.values()
    unknown = sorted(set(test_classes) - set(classes))
    if unknown:
        raise DataError(f"imagefolder: test classes without a train folder: {', '.join(unknown)}")
    index = {name: i for i, name in enumerate(classes)}
    test_labels = [index[test_classes[y]] for y in test_labels]  # the test folder may lack some classes
    stream = wants_stream(decode, len(train_paths) + len(test_paths), size)
    return decode_split("imagefolder", (train_paths, train_labels), (test_paths, test_labels), classes, size,
                        workers, stream=stream)


@register_dataset(
    "imagefolder", store_size=64, input_size=224, needs_root=True,
    description="a labelled folder ROOT/train/<class>/ and ROOT/test/<class>/ (e.g. chest X-rays)",
    preset=Preset(0.01, 32, "sgd"), streams=True,
)
def imagefolder(cfg: DataConfig, stored: int) -> Loaded:
    """The labelled folder ``cfg.root``; its preset is the Table 9 recipe of CIFAR and Tiny-ImageNet. Without
    ``--store-size``, images smaller than the default 64 px are kept at their own side, the most common
    shorter side of the training images, so a folder of 32 px images trains at 32 px, not upsampled to 224;
    one odd image does not set it. Images of another side are resized, with one warning line counting them."""
    if cfg.store_size is None:
        sides, n_images = _shorter_sides(os.path.join(os.path.expanduser(cfg.root), "train"))
        if sides:
            usual = max(sides, key=lambda side: (sides[side], side))  # ties: the larger, less upsampling
            stored = min(stored, usual)
            # resized unlike the rest: any other side when the usual one is kept, else those upsampled
            odd = sum(n for side, n in sides.items() if side != usual and (stored == usual or side < stored))
            if odd:
                read = sum(sides.values())
                sample = f" (a sample of the {n_images})" if n_images > SIDE_SAMPLE else ""
                print(f"warning: imagefolder: {odd} of {read} training images{sample} have a shorter side "
                      f"other than {usual} px, the most common; all are stored at {stored} px (--store-size "
                      f"sets it)", file=sys.stderr)
    return read_imagefolder(cfg.root, stored, decode=cfg.decode)


def _shorter_sides(train_root: str) -> tuple[Counter[int], int]:
    """(how many images under ``train_root`` have each shorter side, the number of images), from headers
    only: at most SIDE_SAMPLE images, evenly spaced in sorted order. Unreadable images are skipped (the
    reader reports them)."""
    paths = sorted(os.path.join(folder, name) for folder, _, names in os.walk(train_root)
                   for name in names if is_image(name))
    sample = [paths[i * len(paths) // SIDE_SAMPLE] for i in range(SIDE_SAMPLE)] \
        if len(paths) > SIDE_SAMPLE else paths
    sides: Counter[int] = Counter()
    for path in sample:
        try:
            with Image.open(path) as img:
                sides[min(img.size)] += 1
        except OSError:
            pass
    return sides, len(paths)
