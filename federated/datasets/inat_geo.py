"""iNaturalist-GEO: iNaturalist-2017 images with the geographic client splits of Hsu et al., ECCV 2020
(GEO-10K / GEO-3K, one client per user), the natural-client dataset of Chen et al., ICLR 2023, §4.2 and
Table 9, fine-tuned at 224 px with ResNet18."""

from __future__ import annotations

import csv
import os
import zlib
from collections.abc import Callable

from pretrain.folder import walk_images

from . import DataConfig, Preset, register_dataset
from .decode import DataError, Loaded, _ids, _require_dir, decode_split

INAT_HOLDOUT = 10  # iNat-GEO without a split column: every 10th image of each client is test (10%)

# Accepted CSV column names, most specific first. Hsu et al.'s published CSVs have user_id, image_id, class
# and label, where `class` is the label of their paper and `label` the original iNaturalist one: so `class`
# is preferred over `label`.
CLIENT_COLUMNS = ("client_id", "client", "user_id", "user")
IMAGE_COLUMNS = ("image_path", "path", "image", "image_id", "file", "filename")
LABEL_COLUMNS = ("class", "class_id", "label", "target")
SPLIT_COLUMNS = ("split", "partition")


def _column(header: list[str], names: tuple[str, ...], what: str, csv_path: str, required: bool = True):
    for name in names:
        if name in header:
            return name
    if required:
        raise DataError(f"inat-geo: {csv_path!r} has no {what} column; its header is {','.join(header)!r}, "
                        f"accepted names: {', '.join(names)}")
    return None


def _label_ids(values: list[str]) -> tuple[list[int], list[str]]:
    """Integer labels keep their value (n_classes = max + 1, e.g. 1,203 for iNat-GEO); names are sorted."""
    if all(v.isdigit() for v in values):
        n = max(int(v) for v in values) + 1
        return [int(v) for v in values], [str(i) for i in range(n)]
    return _ids(values)


def _image_finder(root: str) -> Callable[[str], str | None]:
    """value -> file: ``root/value`` if it is a file, else the image under root whose name stem is the
    value's (iNat-2017 image ids are file stems); the index of stems is built on first use."""
    stems: dict[str, str] = {}

    def find(value: str) -> str | None:
        path = os.path.join(root, value)
        if os.path.isfile(path):
            return path
        if not stems:
            for found in walk_images(root):  # links followed, each real folder and file once
                stems.setdefault(os.path.splitext(os.path.basename(found))[0], found)
        return stems.get(os.path.splitext(os.path.basename(value))[0])

    return find


def _holdout(keys: list[str], clients: list[str]) -> list[bool]:
    """True for test: per client, the n // INAT_HOLDOUT images first in crc32(image key) order; so the test
    set depends neither on the seed nor on the row order, and clients with < 10 images keep all of them."""
    by_client: dict[str, list[int]] = {}
    for i, c in enumerate(clients):
        by_client.setdefault(c, []).append(i)
    test = [False] * len(keys)
    for rows in by_client.values():
        rows = sorted(rows, key=lambda i: (zlib.crc32(keys[i].encode()), keys[i]))
        for i in rows[:len(rows) // INAT_HOLDOUT]:
            test[i] = True
    return test


def _read_split(split_csv: str) -> tuple[list[str], list[str], list[int], list[str], list[bool]]:
    """(client of each row, image of each row, label id of each row, class names, whether each row is a
    test row) of the split CSV; see :func:`read_inat_geo` for the columns it accepts."""
    if not os.path.isfile(split_csv):
        raise DataError(f"inat-geo: split CSV {split_csv!r} does not exist")
    with open(split_csv, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip().lower() for h in next(reader, [])]
        rows = [r for r in reader if any(v.strip() for v in r)]
    client_col = _column(header, CLIENT_COLUMNS, "client", split_csv)
    image_col = _column(header, IMAGE_COLUMNS, "image", split_csv)
    label_col = _column(header, LABEL_COLUMNS, "label", split_csv)
    split_col = _column(header, SPLIT_COLUMNS, "split", split_csv, required=False)
    if not rows:
        raise DataError(f"inat-geo: {split_csv!r} has a header but no rows")
    if any(len(r) != len(header) for r in rows):
        raise DataError(f"inat-geo: {split_csv!r}: every row must have {len(header)} fields")

    def col(name: str) -> list[str]:
        return [r[header.index(name)].strip() for r in rows]

    for name in (client_col, image_col, label_col):
        if "" in col(name):
            raise DataError(f"inat-geo: {split_csv!r} has rows with an empty {name!r}")
    clients, images, (labels, classes) = col(client_col), col(image_col), _label_ids(col(label_col))
    if split_col is None:
        return clients, images, labels, classes, _holdout(images, clients)
    split = [v.lower() for v in col(split_col)]
    if set(split) - {"train", "test"}:
        raise DataError(f"inat-geo: the {split_col!r} column must hold train or test, got "
                        f"{sorted(set(split) - {'train', 'test'})[:3]}")
    return clients, images, labels, classes, [v == "test" for v in split]


def read_inat_geo(root: str, split_csv: str | None, size: int, workers: int | None = None) -> Loaded:
    """iNaturalist-2017 images under ``root`` with the client split of ``split_csv`` (GEO-10K / GEO-3K).

    The CSV header names a client column (client_id, client, user_id, user), an image column (a path
    relative to root, or an image id = file stem: image_path, path, image, image_id, file, filename) and a
    label column (class, class_id, label, target). A ``split``/``partition`` column with values train/test
    picks the test rows; without one, a deterministic 10% of each client's images (see :func:`_holdout`) is
    the test set. Clients are natural: their ids are mapped to 0..K-1 in sorted order.

    Memory: images are held at ``size`` px, 3 S^2 bytes each: 1.2 GB per 100K images at 64 px (the
    default), 0.3 GB at 32 px, 15 GB at 224 px.
    """
    if not split_csv:
        raise DataError("inat-geo needs the client split CSV (--split-csv), e.g. Hsu et al.'s "
                        "federated_train_geo_*.csv from inaturalist-geo.zip")
    root = os.path.expanduser(root)
    _require_dir(root, "inat-geo image root (--data-root)")
    clients, images, labels, classes, test = _read_split(split_csv)
    find = _image_finder(root)
    paths = [find(v) for v in images]
    missing = [v for v, p in zip(images, paths, strict=True) if p is None]
    if missing:
        raise DataError(f"inat-geo: {len(missing)} images of {split_csv!r} not found under {root!r}, "
                        f"e.g. {missing[0]!r}")
    tr = [i for i, t in enumerate(test) if not t]
    te = [i for i, t in enumerate(test) if t]
    if not tr or not te:
        raise DataError(f"inat-geo: {split_csv!r} gives {len(tr)} training and {len(te)} test images")
    client_ids, _ = _ids([clients[i] for i in tr])
    return decode_split("inat-geo", ([paths[i] for i in tr], [labels[i] for i in tr]),
                        ([paths[i] for i in te], [labels[i] for i in te]), classes, size, workers, client_ids)


@register_dataset(
    "inat-geo", store_size=64, input_size=224, needs_root=True,
    description="iNaturalist-2017 images under ROOT with a GEO client split CSV (--split-csv)",
    preset=Preset(0.1, 128, "sgd"), default_partition="natural",
)
def inat_geo(cfg: DataConfig, stored: int) -> Loaded:
    """The images under ``cfg.root`` split into clients by ``cfg.split_csv`` (natural partition)."""
    return read_inat_geo(cfg.root, cfg.split_csv, stored)
