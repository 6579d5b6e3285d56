"""Tiny datasets in each dataset's real on-disk format, for the recipes' smoke runs and the tests.

``SCALE=smoke bash recipes/X.sh`` runs every command of a recipe on a CPU in minutes (recipes/README.md); its
data come from here, written as the published files are laid out, so that the loaders the paper-scale run
uses are the ones the smoke run exercises:

  python recipes/smoke_data.py DIR            every dataset below under DIR (skips those already written)

- ``cifar-10-batches-py/``, ``cifar-100-python/``: Python-2 pickles as Krizhevsky's archives hold them
  (rows C x H x W flattened, uint8; the md5 sums cannot match, so federate runs on them with --no-verify);
- ``tiny-imagenet-200/``: wnids.txt, train/<wnid>/images/*.JPEG, val/images + val/val_annotations.txt;
- ``inat/``: iNaturalist-2017 ``train_val_images/<super>/<species>/<id>.jpg`` with ``train2017.json`` and
  ``val2017.json`` (COCO-style image lists), and Hsu et al.'s split files ``inaturalist-geo/
  federated_train_geo_10k.csv``, ``federated_train_geo_3k.csv`` (user_id, image_id, class, label) and
  ``test.csv`` (image_id, class, label);
- ``cityscapes/``: leftImg8bit/{train,val}/<city>/*_leftImg8bit.png and gtFine/.../*_gtFine_labelIds.png;
- ``imagenet32/``: Chrabaszcz et al.'s down-sampled ImageNet, pickled ``train_data_batch_1..10`` and
  ``val_data`` (``data`` N x 3072 channel-major uint8, 1-based ``labels``);
- ``chest_xray/``: Kermany et al.'s folder train/{NORMAL,PNEUMONIA}/*.jpeg and test/...;
- ``stylegan/``: a folder of generated-looking PNG images (Baradad et al.'s StyleGAN images are a folder);
- ``resnet18_places365.pth.tar`` and ``torch-home/hub/checkpoints/``: weight files (recipes/smoke_weights.py).

Images of class c share a base colour with noise on it, so a smoke run can learn something; the tests use
the writers with solid, numbered colours (:func:`colour`) to check which image went where.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import pickle
import random
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

try:  # the weight files' writers: recipes.smoke_data imported (tests), or this file run as a script
    from recipes.smoke_weights import write_places365, write_torch_hub
except ModuleNotFoundError:
    from smoke_weights import write_places365, write_torch_hub

# ---- images ------------------------------------------------------------------------------------------------


def colour(k: int) -> tuple[int, int, int]:
    """Image k's solid colour: R encodes k (exactly for k < 60), far apart enough to survive JPEG."""
    return (4 * k + 10) % 256, 100 + (k % 3) * 60, 200


def identify(x) -> list[int]:
    """uint8 (N, S, S, 3) solid images of :func:`colour` -> their k."""
    return ((x[..., 0].float().mean((1, 2)) - 10) / 4).round().long().tolist()


def solid(k: int, wh: tuple[int, int]) -> Image.Image:
    return Image.new("RGB", wh, colour(k))


def noisy(c: int, wh: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """An image of class ``c``: its class colour plus noise (a smoke run has something to learn)."""
    base = np.asarray([(53 * c) % 256, (97 * c + 80) % 256, (31 * c + 160) % 256], np.float64)
    pixels = base + rng.normal(0, 40, (wh[1], wh[0], 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def save(path, image: Image.Image, fmt: str = "PNG") -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, fmt, quality=98) if fmt == "JPEG" else image.save(path, fmt)


# ---- CIFAR: Python-2 pickles -------------------------------------------------------------------------------


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING), as the CIFAR files were written:
    torchvision reads them with ``encoding="latin1"``, which turns keys like b"data" into "data"."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj if n < 256
                   else pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def py2_dump(obj, path) -> None:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    Path(path).write_bytes(buf.getvalue())


def write_cifar(root, hundred: bool, per_file: int = 20, seed: int = 0,
                learnable: bool = False) -> dict[str, tuple[np.ndarray, list[int]]]:
    """A cifar-10-batches-py/ (or cifar-100-python/) with ``per_file`` images per file (5 training files for
    CIFAR-10, one for CIFAR-100); returns {file: (data (N, 3072), labels)}. ``learnable``: each image is its
    class colour plus noise, else uniform noise."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True, exist_ok=True)
    n_classes = 100 if hundred else 10
    files = ["train", "test"] if hundred else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    written = {}
    for name in files:
        labels = rng.integers(0, n_classes, per_file).tolist()
        if learnable:  # rows are C, H, W flattened
            data = np.stack([np.asarray(noisy(y, (32, 32), rng)).transpose(2, 0, 1).reshape(-1)
                             for y in labels])
        else:
            data = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        entry = {b"data": data, b"filenames": [f"img{i}.png".encode() for i in range(per_file)]}
        if hundred:
            entry |= {b"fine_labels": labels, b"coarse_labels": [y // 5 for y in labels]}
        else:
            entry |= {b"labels": labels, b"batch_label": f"{name}".encode()}
        py2_dump(entry, folder / name)
        written[name] = (data, labels)
    names = [f"class{i}".encode() for i in range(n_classes)]
    meta = {b"fine_label_names": names, b"coarse_label_names": names[:20]} if hundred else \
        {b"label_names": names, b"num_cases_per_batch": per_file, b"num_vis": 3072}
    py2_dump(meta, folder / ("meta" if hundred else "batches.meta"))
    return written


# ---- Tiny-ImageNet -----------------------------------------------------------------------------------------

TINY_WNIDS = ["n03", "n01", "n02"]  # not sorted: labels must follow wnids.txt, not the folder order


def write_tiny(root, wnids=TINY_WNIDS, per_class: int = 3, val_labels=(2, 0, 1, 2),
               image: Callable[[int, int], Image.Image] | None = None):
    """tiny-imagenet-200/ with per_class train JPEGs a class (k = per_class c + i) and one val JPEG per
    entry of ``val_labels`` (k = 20 + j), 64 px; ``image(k, c)`` draws image k of class c (default: solid
    :func:`colour` k). Returns (folder, {train k: class}, {val k: class})."""
    draw = image or (lambda k, c: solid(k, (64, 64)))
    base = Path(root) / "tiny-imagenet-200"
    base.mkdir(parents=True, exist_ok=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for c, wnid in enumerate(wnids):
        for i in range(per_class):
            save(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", draw(per_class * c + i, c), "JPEG")
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
    lines = []
    for j, c in enumerate(val_labels):
        save(base / "val" / "images" / f"val_{j}.JPEG", draw(20 + j, c), "JPEG")
        lines.append(f"val_{j}.JPEG\t{wnids[c]}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    train_owner = {per_class * c + i: c for c in range(len(wnids)) for i in range(per_class)}
    return base, train_owner, {20 + j: c for j, c in enumerate(val_labels)}


# ---- iNaturalist-GEO ---------------------------------------------------------------------------------------

INAT_CLIENTS = {"geo_b": 12, "geo_a": 10, "geo_c": 20}  # images per client; sorted ids: a=0, b=1, c=2


def write_inat(root, header=("user_id", "image_id", "class", "label"), shuffle: int | None = None,
               clients: dict[str, int] = INAT_CLIENTS, classes: int = 4, csv_name: str | None = "split.csv",
               image: Callable[[int, int], Image.Image] | None = None):
    """iNat-2017-like images ``root/images/train_val_images/<super>/sp<c>/<id>.jpg`` (image ids = file
    stems) and a Hsu-et-al.-style CSV ``root/csv_name`` (none if None); image k has label k % classes (class
    column) and a different original label. Returns the CSV path and {k: (client, label, path relative to
    the images)}."""
    draw = image or (lambda k, c: solid(k, (12, 9)))
    rows, owner = [], {}
    k = 0
    for client, n in clients.items():
        for _ in range(n):
            image_id = f"{k * 7919 % 1000:03d}abc{k}"
            rel = os.path.join("train_val_images", "Plantae", f"sp{k % classes}", f"{image_id}.jpg")
            save(Path(root) / "images" / rel, draw(k, k % classes), "JPEG")
            rows.append([client, image_id, str(k % classes), str(1000 + k)])
            owner[k] = (client, k % classes, rel)
            k += 1
    if csv_name is None:
        return "", owner
    if shuffle is not None:
        random.Random(shuffle).shuffle(rows)
    path = Path(root) / csv_name
    write_csv(path, [list(header)] + rows)
    return str(path), owner


def write_csv(path, rows: list[list[str]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def write_inat_json(images_root, owner: dict[int, tuple[str, int, str]],
                    name: str = "train2017.json") -> None:
    """An iNaturalist-2017 annotation file (COCO-style): ``images`` with integer ids and file names under
    ``images_root``, ``annotations`` with their categories, ``categories``."""
    images = [{"id": k, "file_name": rel.replace(os.sep, "/"), "width": 12, "height": 9}
              for k, (_, _, rel) in owner.items()]
    labels = sorted({label for _, label, _ in owner.values()})
    record = {"images": images, "annotations": [{"id": k, "image_id": k, "category_id": label}
                                                for k, (_, label, _) in owner.items()],
              "categories": [{"id": c, "name": f"sp{c}", "supercategory": "Plantae"} for c in labels]}
    (Path(images_root) / name).write_text(json.dumps(record))


def write_inat_geo(root, n_classes: int = 6, seed: int = 0) -> dict[str, str]:
    """``root/`` as the recipes expect iNaturalist-GEO: images with train2017.json and val2017.json, and
    Hsu et al.'s ``inaturalist-geo/`` files: two client splits over the same training images (GEO-10K: 8
    clients, GEO-3K: 16; at paper scale 39 and 136) and test.csv. Returns their paths."""
    rng = np.random.default_rng(seed)
    clients = {f"cell{i:02d}": 8 for i in range(16)}  # 128 training images
    draw = (lambda k, c: noisy(c, (40, 30), rng))  # noqa: E731
    _, owner = write_inat(root, clients=clients, classes=n_classes, csv_name=None, image=draw)
    ids = {k: Path(rel).stem for k, (_, _, rel) in owner.items()}
    geo = Path(root) / "inaturalist-geo"
    header = ["user_id", "image_id", "class", "label"]
    write_csv(geo / "federated_train_geo_3k.csv",
              [header] + [[c, ids[k], str(y), str(1000 + y)] for k, (c, y, _) in owner.items()])
    write_csv(geo / "federated_train_geo_10k.csv",  # coarser cells: pairs of GEO-3K cells
              [header] + [[f"cell{int(c[4:]) // 2:02d}", ids[k], str(y), str(1000 + y)]
                          for k, (c, y, _) in owner.items()])
    test = {}
    for j in range(8 * n_classes):  # val images: 8 per class
        k = 10_000 + j
        image_id = f"val{j:04d}"
        rel = os.path.join("train_val_images", "Plantae", f"sp{j % n_classes}", f"{image_id}.jpg")
        save(Path(root) / "images" / rel, draw(k, j % n_classes), "JPEG")
        test[k] = ("", j % n_classes, rel)
    write_csv(geo / "test.csv", [["image_id", "class", "label"]] +
              [[Path(rel).stem, str(y), str(1000 + y)] for (_, y, rel) in test.values()])
    write_inat_json(Path(root) / "images", owner, "train2017.json")
    write_inat_json(Path(root) / "images", test, "val2017.json")
    return {"images": str(Path(root) / "images"), "geo10k": str(geo / "federated_train_geo_10k.csv"),
            "geo3k": str(geo / "federated_train_geo_3k.csv"), "test": str(geo / "test.csv")}


# ---- labelled image folders (chest X-rays, the tests' imagefolder) -----------------------------------------


def write_imagefolder(root, test_classes=("cat", "dog")) -> dict[int, int]:
    """ROOT/train/{cat,dog,eel}/, 2 images each (k = 2 c + i); ROOT/test/<test_classes>/ (k = 10, 11, ...)."""
    for c, name in enumerate(["cat", "dog", "eel"]):
        for i in range(2):
            save(Path(root) / "train" / name / f"{i}.png", solid(2 * c + i, (12, 9)))
    test = {}
    for j, name in enumerate(test_classes):
        save(Path(root) / "test" / name / "t.png", solid(10 + j, (12, 9)))
        test[10 + j] = ["cat", "dog", "eel"].index(name) if name in ("cat", "dog", "eel") else -1
    return test


def write_chest_xray(root, train_per_class: int = 40, test_per_class: int = 10, seed: int = 0) -> None:
    """Kermany et al.'s layout: ROOT/{train,test}/{NORMAL,PNEUMONIA}/*.jpeg, grey images of another size
    each (the chest X-rays are grey, of many sizes)."""
    rng = np.random.default_rng(seed)
    for part, n in (("train", train_per_class), ("test", test_per_class)):
        for c, name in enumerate(("NORMAL", "PNEUMONIA")):
            for i in range(n):
                wh = (int(rng.integers(80, 120)), int(rng.integers(70, 110)))
                grey = noisy(3 * c, wh, rng).convert("L")
                save(Path(root) / part / name / f"{name.lower()}-{i:04d}.jpeg", grey, "JPEG")


def write_image_pile(root, n: int = 96, side: int = 32, seed: int = 0) -> None:
    """An unlabelled folder of PNG images in sub-folders (Baradad et al.'s StyleGAN images ship so)."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        image = noisy(int(rng.integers(0, 20)), (side, side), rng)
        save(Path(root) / f"{i // 32:03d}" / f"{i:06d}.png", image)


# ---- Cityscapes --------------------------------------------------------------------------------------------

CS_H, CS_W = 64, 128  # px, stored (H x W) of the miniature images: Cityscapes' 1:2 aspect
CS_BLOCK = 16  # px side of the constant-label blocks
CS_TRAIN_CITIES = ("bremen", "aachen", "zurich")  # written unsorted: clients must follow the sorted names
CS_VAL_CITY = "frankfurt"
CS_IDS = (0, 1, 3, 4, 7, 8, 11, 24, 26)  # real Cityscapes label ids, some ignored (0-4), some evaluated


def _label_ids(k: int) -> np.ndarray:
    """(H, W) uint8 label ids in CS_BLOCK-px blocks, cycling through CS_IDS, shifted by k per image."""
    r, c = np.meshgrid(np.arange(CS_H) // CS_BLOCK, np.arange(CS_W) // CS_BLOCK, indexing="ij")
    return np.asarray(CS_IDS, dtype=np.uint8)[(r + 2 * c + k) % len(CS_IDS)]


def write_cityscapes(root, per_city: int = 2, train_cities=CS_TRAIN_CITIES) -> dict:
    """ROOT/leftImg8bit/{train,val}/<city>/<city>_<seq>_<frame>_leftImg8bit.png (RGB) and
    ROOT/gtFine/{train,val}/<city>/..._gtFine_labelIds.png (mode L), as in the official zips; returns
    {split: [(city, image (H, W, 3), label ids (H, W))]} in the loader's (sorted path) order."""
    rng = np.random.default_rng(0)
    written: dict[str, list] = {"train": [], "val": []}
    k = 0
    for split, cities in (("train", train_cities), ("val", (CS_VAL_CITY,))):
        for city in cities:
            for i in range(per_city):
                stem = f"{city}_{i:06d}_{19 + 3 * i:06d}"
                image = rng.integers(0, 256, (CS_H, CS_W, 3), dtype=np.uint8)
                ids = _label_ids(k)
                k += 1
                for folder, name, array in (("leftImg8bit", f"{stem}_leftImg8bit.png", image),
                                            ("gtFine", f"{stem}_gtFine_labelIds.png", ids)):
                    save(Path(root) / folder / split / city / name, Image.fromarray(array))
                written[split].append((f"leftImg8bit/{split}/{city}/{stem}", city, image, ids))
    return {split: [w[1:] for w in sorted(rows, key=lambda w: w[0])] for split, rows in written.items()}


# ---- ImageNet32 and Places365 ------------------------------------------------------------------------------


def write_imagenet32(root, per_batch: int = 40, classes: int = 10, side: int = 32, seed: int = 0,
                     val: int = 50) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Chrabaszcz et al. 2017's down-sampled ImageNet as published: ``train_data_batch_1`` ..
    ``train_data_batch_10`` and ``val_data``, each a pickled dict with ``data`` (N, 3 side^2) uint8 rows
    (all R, then G, then B), ``labels`` (1-based class ids) and, in the train batches, ``mean``. Returns
    {file: (data, labels)}."""
    rng = np.random.default_rng(seed)
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in [f"train_data_batch_{i}" for i in range(1, 11)] + ["val_data"]:
        n = val if name == "val_data" else per_batch
        labels = rng.integers(1, classes + 1, n).tolist()
        data = np.stack([np.asarray(noisy(y - 1, (side, side), rng)).transpose(2, 0, 1).reshape(-1)
                         for y in labels])
        entry = {"data": data, "labels": labels}
        if name != "val_data":
            entry["mean"] = data.mean(0)
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        written[name] = (data, labels)
    return written


# ---- everything, for the recipes ---------------------------------------------------------------------------

WRITERS: dict[str, Callable[[Path], object]] = {
    "cifar10": lambda d: write_cifar(d, hundred=False, per_file=60, learnable=True),
    "cifar100": lambda d: write_cifar(d, hundred=True, per_file=300, learnable=True),
    "tinyimagenet": lambda d: write_tiny(d, wnids=[f"n{i:08d}" for i in range(8)], per_class=40,
                                         val_labels=[i % 8 for i in range(32)],
                                         image=_seeded(lambda rng, k, c: noisy(c, (64, 64), rng))),
    "inat": lambda d: write_inat_geo(d / "inat"),
    "cityscapes": lambda d: write_cityscapes(d / "cityscapes", per_city=2,
                                             train_cities=("aachen", "bremen", "zurich", "ulm")),
    "imagenet32": lambda d: write_imagenet32(d / "imagenet32"),
    "places365": lambda d: write_places365(d / "resnet18_places365.pth.tar"),
    "chest_xray": lambda d: write_chest_xray(d / "chest_xray"),
    "stylegan": lambda d: write_image_pile(d / "stylegan"),
    "torch_hub": lambda d: write_torch_hub(d / "torch-home" / "hub" / "checkpoints"),
}


def _seeded(draw: Callable[[np.random.Generator, int, int], Image.Image]
            ) -> Callable[[int, int], Image.Image]:
    rng = np.random.default_rng(0)
    return lambda k, c: draw(rng, k, c)


def write_all(out, only: list[str] | None = None) -> list[str]:
    """Every dataset of :data:`WRITERS` (or ``only`` those) under ``out``; one already written (its marker
    file ``.done-NAME`` exists) is skipped. Returns the names written now."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name in only or list(WRITERS):
        marker = out / f".done-{name}"
        if marker.exists():
            continue
        WRITERS[name](out)
        marker.write_text("")
        done.append(name)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="smoke_data.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder to write the datasets into (created)")
    p.add_argument("--only", default=None, help=f"comma-separated subset of {', '.join(WRITERS)}")
    args = p.parse_args(argv)
    only = args.only.split(",") if args.only else None
    unknown = sorted(set(only or []) - set(WRITERS))
    if unknown:
        print(f"smoke_data.py: error: unknown dataset(s) {', '.join(unknown)}; choose from "
              f"{', '.join(WRITERS)}", file=sys.stderr)
        return 2
    written = write_all(args.out, only)
    print(f"smoke data in {args.out}: wrote {', '.join(written) or 'nothing (all there)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
