"""A labelled image folder ``ROOT/{train,test}/<class>/<image>``: the medical images (e.g. chest X-rays) of
Chen et al., ICLR 2023, §4.5, fine-tuned at 224 px with ResNet18."""

from __future__ import annotations

import os

from PIL import Image

from pretrain.folder import FolderConfig, FolderError, is_image, scan

from . import DataConfig, Preset, register_dataset
from .decode import DataError, Loaded, _require_dir
from .stream import decode_split, wants_stream


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
    ``--store-size``, images smaller than the default 64 px are kept at their own side (the shorter side
    of the first training image), so a folder of 32 px images trains at 32 px, not upsampled to 224."""
    if cfg.store_size is None:
        stored = min(stored, _own_side(os.path.join(os.path.expanduser(cfg.root), "train")))
    return read_imagefolder(cfg.root, stored, decode=cfg.decode)


def _own_side(train_root: str) -> int:
    """The shorter side of the first image under ``train_root`` (header only), or a large number."""
    for folder, _, names in sorted(os.walk(train_root)):
        for name in sorted(names):
            if is_image(name):
                try:
                    with Image.open(os.path.join(folder, name)) as img:
                        return min(img.size)
                except OSError:
                    return 1 << 30  # unreadable: the reader reports it
    return 1 << 30
