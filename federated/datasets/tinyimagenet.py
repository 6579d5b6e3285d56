"""Tiny-ImageNet (``tiny-imagenet-200/``, 200 classes of 64 px images): trained at its own 64 x 64 px with
ResNet18 (Chen et al., ICLR 2023, §4.2, Tables 1 and 8: resolution 64^2; Table 9); its labelled val split is
our test set."""

from __future__ import annotations

import os

from pretrain.folder import is_image

from . import DataConfig, Preset, register_dataset
from .decode import DataError, Loaded, _read_text, _require_dir
from .stream import decode_split, wants_stream


def read_tinyimagenet(root: str, size: int, workers: int | None = None, decode: str = "auto") -> Loaded:
    """``tiny-imagenet-200/``: train/<wnid>/images/*.JPEG; its val split (val_annotations.txt) is our test.

    ``root`` is the folder itself or its parent. Labels follow the order of wnids.txt; class names are wnids.
    """
    root = os.path.expanduser(root)
    inside = os.path.isfile(os.path.join(root, "wnids.txt"))
    base = root if inside else os.path.join(root, "tiny-imagenet-200")
    if not os.path.isfile(os.path.join(base, "wnids.txt")):
        raise DataError(f"tinyimagenet: no wnids.txt in {root!r} nor in {base!r}; unzip "
                        f"tiny-imagenet-200.zip (http://cs231n.stanford.edu/tiny-imagenet-200.zip) there")
    listing = os.path.join(base, "wnids.txt")
    wnids = [line.strip() for line in _read_text(listing, "tinyimagenet").splitlines() if line.strip()]
    if not wnids:
        raise DataError(f"tinyimagenet: {listing!r} lists no wnid (one class id a line)")
    index = {w: i for i, w in enumerate(wnids)}
    if len(index) < len(wnids):
        twice = next(w for i, w in enumerate(wnids) if index[w] != i)
        raise DataError(f"tinyimagenet: {listing!r} lists {twice!r} twice; each class once")
    train_paths, train_labels = [], []
    for i, wnid in enumerate(wnids):
        folder = os.path.join(base, "train", wnid, "images")
        _require_dir(folder, "tinyimagenet training images")
        found = sorted(n for n in os.listdir(folder) if is_image(n))
        if not found:
            raise DataError(f"tinyimagenet: no images in {folder!r}")
        train_paths += [os.path.join(folder, n) for n in found]
        train_labels += [i] * len(found)
    annotations = os.path.join(base, "val", "val_annotations.txt")
    if not os.path.isfile(annotations):
        raise DataError(f"tinyimagenet: {annotations!r} does not exist (it labels val/, our test set)")
    test_paths, test_labels, listed = [], [], set()
    for n, line in enumerate(_read_text(annotations, "tinyimagenet").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2 or fields[1] not in index:
            raise DataError(f"tinyimagenet: {annotations}:{n}: expected 'FILE WNID ...' with a wnid of "
                            f"wnids.txt, got {line.strip()!r}")
        if os.path.basename(fields[0]) != fields[0] or fields[0] in (".", "..") or fields[0] in listed:
            problem = "listed twice" if fields[0] in listed else "not a file name in val/images/"
            raise DataError(f"tinyimagenet: {annotations}:{n}: {fields[0]!r} is {problem}")
        listed.add(fields[0])
        test_paths.append(os.path.join(base, "val", "images", fields[0]))
        test_labels.append(index[fields[1]])
    if not test_paths:
        raise DataError(f"tinyimagenet: {annotations!r} labels no image (our test set)")
    stream = wants_stream(decode, len(train_paths) + len(test_paths), size)
    return decode_split("tinyimagenet", (train_paths, train_labels), (test_paths, test_labels), wnids, size,
                        workers, stream=stream)


@register_dataset(
    "tinyimagenet", store_size=64, input_size=64, needs_root=True,  # Tables 1 and 8: 64^2
    description="Tiny-ImageNet: ROOT/tiny-imagenet-200/ (or that folder itself); val = test",
    # self-pre-training with Orchestra: 256 local / 32 global clusters on Tiny-ImageNet (App. B.3)
    preset=Preset(0.01, 32, "sgd", {"orchestra": {"local_clusters": 256, "global_clusters": 32}}),
    streams=True,
)
def tinyimagenet(cfg: DataConfig, stored: int) -> Loaded:
    """Tiny-ImageNet from ``cfg.root`` (the folder itself or its parent)."""
    return read_tinyimagenet(cfg.root, stored, decode=cfg.decode)
