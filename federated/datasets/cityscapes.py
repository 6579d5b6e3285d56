"""Cityscapes with fine labels (Cordts et al., CVPR 2016; ``leftImg8bit/`` + ``gtFine/``): the segmentation
task of Chen et al., ICLR 2023, Table 5 (DeepLabV3+ with MobileNetV2, 18 city clients, 768 px crops)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from fpsfl.base.images import pil_rgb
from fpsfl.base.settings import setting

from . import DataConfig, DatasetSettings, Preset, register_dataset
from .decode import DataError, Loaded, _ids, _labels, _require_dir, decode_parallel

CITYSCAPES_LAYOUT = ("ROOT/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png and "
                     "ROOT/gtFine/{train,val}/<city>/*_gtFine_labelIds.png")
CITYSCAPES_SUFFIX = "_leftImg8bit.png"  # every image name ends so; the label's is _gtFine_labelIds.png
IGNORE_ID = 255  # train id of the classes not evaluated (Cordts et al., CVPR 2016: 19 of 34 classes)
ASPECT = 2  # width / height of every Cityscapes image (Cordts et al., CVPR 2016: 2048 x 1024 px)


def cityscapes_train_ids() -> tuple[np.ndarray, list[str]]:
    """(lut, names): a 256-entry uint8 table label id -> train id (255 for ignored and unknown ids) and the
    19 evaluated class names in train-id order, both from ``torchvision.datasets.Cityscapes.classes``."""
    from torchvision.datasets import Cityscapes

    lut = np.full(256, IGNORE_ID, dtype=np.uint8)
    names: dict[int, str] = {}
    for c in Cityscapes.classes:
        if 0 <= c.id < 256 and 0 <= c.train_id < IGNORE_ID:  # license plate: id -1, train id -1
            lut[c.id] = c.train_id
            names[c.train_id] = c.name
    return lut, [names[t] for t in sorted(names)]


def _cityscapes_files(root: str, split: str) -> tuple[list[str], list[str]]:
    """Sorted (image, labelIds) path pairs of ``split`` as torchvision's Cityscapes lists them."""
    from torchvision.datasets import Cityscapes

    try:
        ds = Cityscapes(root, split=split, mode="fine", target_type="semantic")
    except RuntimeError as e:  # "Dataset not found or incomplete": a split folder is missing
        missing = [f"{d}/{split}/" for d in ("leftImg8bit", "gtFine") if not os.path.isdir(
            os.path.join(root, d, split))]
        raise DataError(f"cityscapes: {root!r} has no {' nor '.join(missing) or split + ' split'} "
                        f"(expected {CITYSCAPES_LAYOUT})") from e
    except OSError as e:  # e.g. a file where torchvision expects a <city>/ folder
        raise DataError(f"cityscapes: cannot list the {split} split under {root!r}: {e}") from e
    pairs = sorted((img, tgt[0]) for img, tgt in zip(ds.images, ds.targets, strict=True)
                   if img.endswith(CITYSCAPES_SUFFIX))
    if not pairs:
        raise DataError(f"cityscapes: no *{CITYSCAPES_SUFFIX} under {ds.images_dir!r}")
    missing = [t for _, t in pairs if not os.path.isfile(t)]
    if missing:
        raise DataError(f"cityscapes: {len(missing)} label files of the {split} split are missing, e.g. "
                        f"{missing[0]!r}")
    return [i for i, _ in pairs], [t for _, t in pairs]


def _open(path: str) -> Image.Image:
    try:
        img = Image.open(path)
        img.load()
        return img
    except Exception as e:  # any failure to decode is a problem with this file, reported as such
        raise DataError(f"cityscapes: cannot read {path!r}: {type(e).__name__}: {e}") from e


def _eight_bit_ids(ids: Image.Image, path: str) -> Image.Image:
    """An 8-bit single-channel label-id image (16-bit ones clipped: ids >= 255 are ignored anyway)."""
    if ids.mode in ("L", "P"):
        return ids
    if ids.mode.startswith("I"):
        return Image.fromarray(np.clip(np.asarray(ids.convert("I")), 0, IGNORE_ID).astype(np.uint8))
    raise DataError(f"cityscapes: label {path!r} has mode {ids.mode}; expected single-channel label ids")


def decode_cityscapes(images: list[str], labels: list[str], height: int, lut: np.ndarray,
                      workers: int | None = None,
                      desc: str = "cityscapes") -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, height, W, 3), resized bilinear with antialiasing, and uint8 train ids (N, height,
    W), label ids resized nearest then mapped through ``lut``. W is Cityscapes' own aspect (``ASPECT`` x
    height), never one file's: an image of another aspect is refused by name, whichever file comes first."""
    width = ASPECT * height
    x = np.empty((len(images), height, width, 3), dtype=np.uint8)
    y = np.empty((len(images), height, width), dtype=np.uint8)

    def fill(i: int) -> None:
        with _open(images[i]) as img, _open(labels[i]) as ids:
            (w, h), (lw, lh) = img.size, ids.size
            if (lw, lh) != (w, h):
                raise DataError(f"cityscapes: label {labels[i]!r} is {lw}x{lh} px (W x H) but its image "
                                f"is {w}x{h}")
            if w != ASPECT * h:
                raise DataError(f"cityscapes: {images[i]!r} is {w}x{h} px (W x H); Cityscapes images are "
                                f"{ASPECT}:1 (2048x1024), stored here at {width}x{height}")
            try:
                rgb = pil_rgb(img)  # 16-bit scaled to 8, transparency on black
            except ValueError as e:
                raise DataError(f"cityscapes: {images[i]!r}: {e}") from None
            x[i] = np.asarray(rgb.resize((width, height), Image.Resampling.BILINEAR))
            small = _eight_bit_ids(ids, labels[i]).resize((width, height), Image.Resampling.NEAREST)
            y[i] = lut[np.asarray(small)]

    decode_parallel(len(images), fill, workers, desc)
    return torch.from_numpy(x), torch.from_numpy(y)


def read_cityscapes(root: str, store_size: int, workers: int | None = None) -> Loaded:
    """Cityscapes with fine labels (Cordts et al., CVPR 2016) as Chen et al., ICLR 2023, Table 5 use it:
    the 2,975 ``train`` images of 18 cities, one client per city; the official 500 ``val`` images are the
    test set. Files are listed by ``torchvision.datasets.Cityscapes`` (mode fine, target semantic); label
    ids become the 19 train ids (255: ignored). Clients: the cities (file-name prefix before the first
    ``_``) in sorted order, 0..K-1.

    ``store_size`` is the stored HEIGHT; the width is twice it (Cityscapes' 2048 x 1024 aspect).
    PIL's bilinear resize is antialiased. Memory: at 1024 px (full resolution) the train split takes
    18.7 GB of images + 6.2 GB of labels and val 3.1 + 1.0 GB; ``--store-size 512`` quarters it.
    """
    root = os.path.expanduser(root)
    _require_dir(root, "cityscapes root (--data-root)")
    missing = [f"{d}/" for d in ("leftImg8bit", "gtFine") if not os.path.isdir(os.path.join(root, d))]
    if missing:
        raise DataError(f"cityscapes: {root!r} has no {' nor '.join(missing)} folder; expected "
                        f"{CITYSCAPES_LAYOUT}")
    lut, classes = cityscapes_train_ids()
    train_images, train_labels = _cityscapes_files(root, "train")
    test_images, test_labels = _cityscapes_files(root, "val")
    cities = [os.path.basename(p).split("_", 1)[0] for p in train_images]
    client_ids, _ = _ids(cities)
    train_x, train_y = decode_cityscapes(train_images, train_labels, store_size, lut, workers,
                                         "cityscapes train")
    test_x, test_y = decode_cityscapes(test_images, test_labels, store_size, lut, workers, "cityscapes val")
    return Loaded(train_x, train_y, test_x, test_y, classes, _labels(client_ids))


# Table 5: stored at full resolution (1024 x 2048; 25 GB of train images + labels), 768 px crops
@dataclass(frozen=True)
class CityscapesSettings(DatasetSettings):
    """What the segmentation task (federated.tasks.segmentation) crops and tests at (Table 5)."""

    crop_size: int | None = setting(None, "px of the square training crops", within="[1, inf)",
                                    group="segmentation (cityscapes)", default_text="768, the paper's")
    eval_size: str | None = setting(None, "HxW test resolution", group="segmentation (cityscapes)",
                                    default_text="as stored; the paper's 1024x2048")


@register_dataset(
    "cityscapes", store_size=1024, input_size=768, needs_root=True,
    description=f"Cityscapes fine: {CITYSCAPES_LAYOUT}; cities = clients, val = test; "
                "--store-size is the height (512 quarters the 25 GB)",
    preset=Preset(0.001, 16, "adam"), default_partition="natural", default_arch="mobilenet_v2",
    task="segmentation", settings=CityscapesSettings,
)
def cityscapes(cfg: DataConfig, stored: int) -> Loaded:
    """Cityscapes from ``cfg.root``, ``stored`` px high; the cities are the clients (natural partition)."""
    return read_cityscapes(cfg.root, stored)
