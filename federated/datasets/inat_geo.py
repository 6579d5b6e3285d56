"""iNaturalist-GEO: iNaturalist-2017 images with the geographic client splits of Hsu et al., ECCV 2020
(GEO-10K / GEO-3K, one client per geographic cell), the natural-client dataset of Chen et al., ICLR 2023,
§4.2, Tables 1, 4 and 9, fine-tuned at 224 px with ResNet18.

The images stay files and are decoded at 224 px batch by batch (:mod:`federated.datasets.stream`; 120K
training images at 224 px would be 18 GB as one array). Hsu et al.'s ``test.csv`` (``--test-csv``) is the
global test set; without it a deterministic 10% of each client's images is held out instead."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from fpsfl.base.settings import setting
from pretrain.folder import walk_images

from . import DataConfig, DatasetSettings, Preset, own_settings, register_dataset
from .decode import DataError, Loaded, _ids, _is_int, _read_text, _require_dir
from .stream import decode_split, wants_stream

INAT_HOLDOUT = 10  # iNat-GEO without a split column: every 10th image of each client is test (10%)
MAX_CLASSES = 100_000  # integer class ids above are refused (iNaturalist-2021 has 10,000 classes)

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
    if all(_is_int(v) for v in values):  # none negative: _read_csv refuses them
        n = max(int(v) for v in values) + 1
        return [int(v) for v in values], [str(i) for i in range(n)]
    return _ids(values)


INAT_JSONS = ("train2017.json", "val2017.json")  # iNaturalist-2017's annotation files: image ids -> files


def _under(root: str, value: str, where: str) -> str:
    """``root/value``, refused (one line) when ``value`` would leave root, absolute or climbing with ``..``:
    a split or annotation file names images of the dataset, never any file the user can read. Links under
    root are followed as the folder walk follows them."""
    path, top = os.path.abspath(os.path.join(root, value)), os.path.abspath(root)
    if os.path.isabs(value) or os.path.commonpath([top, path]) != top:
        raise DataError(f"inat-geo: {where} names the image {value!r}, outside --data-root {root!r}; image "
                        f"paths are relative to the dataset's folder")
    return os.path.join(root, value)


def _json_index(root: str) -> dict[str, str]:
    """image id and file stem -> file, from iNaturalist-2017's annotation files in ``root`` (COCO-style
    ``images`` lists of ``id`` and ``file_name``); empty when there are none."""
    index: dict[str, str] = {}
    for name in INAT_JSONS:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                images = json.load(f)["images"]
            for image in images:
                file = _under(root, image["file_name"], repr(path))
                index.setdefault(str(image["id"]), file)
                index.setdefault(os.path.splitext(os.path.basename(image["file_name"]))[0], file)
        except DataError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"inat-geo: {path!r} is not an iNaturalist annotation file with an 'images' list "
                            f"of id and file_name ({type(e).__name__}: {e})") from e
    return index


def _image_finder(root: str) -> Callable[[str], str | None]:
    """value -> file: ``root/value`` if it is a file, else the file train2017.json / val2017.json give that
    image id or stem, else the image under root whose name stem is the value's (iNat-2017 image ids are
    file stems); the indexes are built on first use."""
    stems: dict[str, str] = {}
    listed: dict[str, str] | None = None

    def find(value: str) -> str | None:
        nonlocal listed
        path = _under(root, value, "a split CSV (--split-csv / --test-csv)")
        if os.path.isfile(path):
            return path
        if listed is None:
            listed = _json_index(root)
        stem = os.path.splitext(os.path.basename(value))[0]
        if value in listed or stem in listed:
            return listed.get(value) or listed[stem]
        if not stems:
            for found in walk_images(root):  # links followed, each real folder and file once
                stems.setdefault(os.path.splitext(os.path.basename(found))[0], found)
        return stems.get(stem)

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


def _read_csv(path: str, what: str, client: bool = True) -> dict[str, list[str]]:
    """The columns of a split CSV by role: client (when ``client``), image, label and (optional) split."""
    if not os.path.isfile(path):
        raise DataError(f"inat-geo: {what} {path!r} does not exist")
    reader = csv.reader(io.StringIO(_read_text(path, "inat-geo"), newline=""))
    header = [h.strip().lower() for h in next(reader, [])]
    rows = [r for r in reader if any(v.strip() for v in r)]
    names = {"image": _column(header, IMAGE_COLUMNS, "image", path),
             "label": _column(header, LABEL_COLUMNS, "label", path),
             "split": _column(header, SPLIT_COLUMNS, "split", path, required=False)}
    if client:
        names["client"] = _column(header, CLIENT_COLUMNS, "client", path)
    if not rows:
        raise DataError(f"inat-geo: {path!r} has a header but no rows")
    if any(len(r) != len(header) for r in rows):
        raise DataError(f"inat-geo: {path!r}: every row must have {len(header)} fields")
    columns = {role: [r[header.index(name)].strip() for r in rows] for role, name in names.items() if name}
    for role in ("client", "image", "label"):
        if "" in columns.get(role, []):
            raise DataError(f"inat-geo: {path!r} has rows with an empty {names[role]!r}")
    bad = next((v for v in columns["label"] if re.fullmatch(r"-?[0-9]+", v)
                and (v.startswith("-") or len(v) > 9 or int(v) >= MAX_CLASSES)), None)
    if bad is not None:  # ids keep their value (n_classes = max + 1): a wild one would build a huge head
        raise DataError(f"inat-geo: {path!r} has the class id {bad[:24]} in its {names['label']!r} column; "
                        f"integer ids must lie in 0..{MAX_CLASSES - 1} (iNat-GEO uses 0..1202)")
    if "split" in columns:
        split = [v.lower() for v in columns["split"]]
        if set(split) - {"train", "test"}:
            raise DataError(f"inat-geo: the {names['split']!r} column must hold train or test, got "
                            f"{sorted(set(split) - {'train', 'test'})[:3]}")
        columns["split"] = split
    return columns


def _read_split(split_csv: str, test_csv: str | None = None
                ) -> tuple[list[str], list[str], list[int], list[str], list[bool]]:
    """(client of each row, image of each row, label id of each row, class names, whether each row is a
    test row) of the split CSV and, when given, the test CSV (whose rows come last, client ""); see
    :func:`read_inat_geo` for the columns they accept."""
    train = _read_csv(split_csv, "split CSV")
    test = _read_csv(test_csv, "test CSV", client=False) if test_csv else None
    clients, images = train["client"], train["image"]
    labels, classes = _label_ids(train["label"] + (test["label"] if test else []))
    if test is not None:
        keep = [i for i, v in enumerate(train.get("split", ["train"] * len(images))) if v == "train"]
        m = len(test["image"])
        return ([clients[i] for i in keep] + [""] * m, [images[i] for i in keep] + test["image"],
                [labels[i] for i in keep] + labels[len(images):], classes, [False] * len(keep) + [True] * m)
    if "split" not in train:
        return clients, images, labels, classes, _holdout(images, clients)
    return clients, images, labels, classes, [v == "test" for v in train["split"]]


def read_inat_geo(root: str, split_csv: str | None, size: int, workers: int | None = None,
                  test_csv: str | None = None, decode: str = "auto") -> Loaded:
    """iNaturalist-2017 images under ``root`` with the client split of ``split_csv`` (GEO-10K / GEO-3K).

    The CSV header names a client column (client_id, client, user_id, user), an image column (a path
    relative to root, or an image id: image_path, path, image, image_id, file, filename) and a label column
    (class, class_id, label, target). An image id is found through iNaturalist-2017's train2017.json /
    val2017.json in root when they are there, else as a file stem under root. ``test_csv`` (Hsu et al.'s
    test.csv: image and label columns) is the test set, every split row then training; without it a
    ``split``/``partition`` column with values train/test picks the test rows, and without one a
    deterministic 10% of each client's images (see :func:`_holdout`) is the test set. Clients are natural:
    their ids are mapped to 0..K-1 in sorted order.

    Memory: streamed images (``decode`` auto, the default) cost only their paths; held in memory
    (``decode=memory``) they take 3 S^2 bytes each: 18 GB per 120K images at 224 px, 1.5 GB at 64 px.
    """
    if not split_csv:
        raise DataError("inat-geo needs the client split CSV (--split-csv), e.g. Hsu et al.'s "
                        "federated_train_geo_*.csv from inaturalist-geo.zip")
    root = os.path.expanduser(root)
    _require_dir(root, "inat-geo image root (--data-root)")
    clients, images, labels, classes, test = _read_split(split_csv, test_csv)
    find = _image_finder(root)
    paths = [find(v) for v in images]
    source = [test_csv if test_csv and t else split_csv for t in test]  # the CSV each row comes from
    missing = [i for i, p in enumerate(paths) if p is None]
    if missing:
        raise DataError(f"inat-geo: {len(missing)} images of {source[missing[0]]!r} not found under "
                        f"{root!r}, e.g. {images[missing[0]]!r}")
    first: dict[str, int] = {}
    for i, p in enumerate(paths):  # one label per image, and no test image trained on
        if (j := first.setdefault(os.path.normpath(p), i)) != i:
            also = f" (first as {images[j]!r})" if images[j] != images[i] else ""
            where = (f"twice in {source[i]!r}" if source[i] == source[j]
                     else f"in {source[j]!r} and {source[i]!r}")
            raise DataError(f"inat-geo: the image {images[i]!r} is listed {where}{also}; each image once")
    tr = [i for i, t in enumerate(test) if not t]
    te = [i for i, t in enumerate(test) if t]
    if not tr or not te:
        raise DataError(f"inat-geo: {split_csv!r} gives {len(tr)} training and {len(te)} test images")
    client_ids, _ = _ids([clients[i] for i in tr])
    return decode_split("inat-geo", ([paths[i] for i in tr], [labels[i] for i in tr]),
                        ([paths[i] for i in te], [labels[i] for i in te]), classes, size, workers, client_ids,
                        stream=wants_stream(decode, len(paths), size, large=True))


@dataclass(frozen=True)
class InatGeoSettings(DatasetSettings):
    SPLIT = ("split_csv",)  # the GEO split assigns the clients' images: a shard manifest records it
    split_csv: str | None = setting(None, "inat-geo: the GEO-10K/GEO-3K client split CSV (Hsu et al.'s "
                                          "federated_train_geo_*.csv)", group="data")
    test_csv: str | None = setting(None, "inat-geo: the test split CSV (Hsu et al.'s test.csv, image_id and "
                                         "class), the global test set of Table 4", group="data",
                                   default_text="none: 10% of each client's images are held out")


@register_dataset(
    "inat-geo", store_size=224, input_size=224, needs_root=True,  # Tables 1 and 8: 224^2, decoded per batch
    description="iNaturalist-2017 images under ROOT with a GEO client split CSV (--split-csv) and "
                "test.csv (--test-csv)",
    preset=Preset(0.1, 128, "sgd"), default_partition="natural", streams=True, settings=InatGeoSettings,
)
def inat_geo(cfg: DataConfig, stored: int) -> Loaded:
    """The images under ``cfg.root`` split into clients by ``--split-csv`` (natural partition)."""
    own = own_settings(cfg)
    return read_inat_geo(cfg.root, own.split_csv, stored, test_csv=own.test_csv, decode=cfg.decode)
