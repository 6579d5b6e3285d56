"""Readers of the on-disk dataset formats used by ``federate``, each returning uint8 arrays in memory.

Chen et al., ICLR 2023, §4.2 and §4.5 fine-tune in federated learning on CIFAR-10/100, Tiny-ImageNet,
iNaturalist-GEO (the geographic client splits of Hsu et al., ECCV 2020) and a labelled image folder (e.g. the
chest X-rays of §4.5); Table 5 segments Cityscapes. Each reader takes explicit arguments and returns a
:class:`Loaded`: images uint8 (N, S, S, 3) channels-last (as the fractal renderer writes them) at the stored
side S, int64 labels, and the class names; for Cityscapes images (N, H, W, 3) and uint8 train-id label maps
(N, H, W). :mod:`federated.datasets` wraps them in its registry and splits off validation data.

Folder images are decoded with :func:`pretrain.folder.load_image` (shorter side resized to S, bilinear,
antialiased, centre crop) on a thread pool: PIL releases the GIL while decoding and resizing.
"""

from __future__ import annotations

import csv
import os
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tqdm import tqdm

from pretrain.folder import FolderConfig, FolderError, is_image, load_image, scan

DECODE_CHUNK = 256  # images per thread-pool task: few enough tasks to keep the pool's queue small
PROGRESS_MIN = 1000  # images: a progress bar is shown when decoding more
INAT_HOLDOUT = 10  # iNat-GEO without a split column: every 10th image of each client is test (10%)

# Accepted CSV column names, most specific first. Hsu et al.'s published CSVs have user_id, image_id, class
# and label, where `class` is the label of their paper and `label` the original iNaturalist one: so `class`
# is preferred over `label`.
CLIENT_COLUMNS = ("client_id", "client", "user_id", "user")
IMAGE_COLUMNS = ("image_path", "path", "image", "image_id", "file", "filename")
LABEL_COLUMNS = ("class", "class_id", "label", "target")
SPLIT_COLUMNS = ("split", "partition")


class DataError(ValueError):
    """A one-line, user-facing problem with a dataset; the CLI prints it and exits 2."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))  # one line, whatever was interpolated


class Loaded(NamedTuple):
    train_x: torch.Tensor  # uint8 (N, S, S, 3); segmentation: (N, H, W, 3)
    train_y: torch.Tensor  # int64 (N,); segmentation: uint8 (N, H, W) train ids, 255 ignored
    test_x: torch.Tensor  # uint8 (M, S, S, 3); segmentation: (M, H, W, 3)
    test_y: torch.Tensor  # int64 (M,); segmentation: uint8 (M, H, W)
    classes: list[str]
    clients: torch.Tensor | None = None  # int64 (N,) natural client of each training image, 0..K-1


def _labels(values: list[int]) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1))


def resize_uint8(x: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> uint8 (N, size, size, 3), bilinear, antialiased when shrinking; in chunks."""
    if x.shape[1] == size and x.shape[2] == size:
        return x
    out = torch.empty((x.shape[0], size, size, 3), dtype=torch.uint8)
    for i in range(0, x.shape[0], chunk):
        xs = x[i:i + chunk].permute(0, 3, 1, 2).float()
        ys = F.interpolate(xs, size=(size, size), mode="bilinear", align_corners=False,
                           antialias=size < x.shape[1])
        out[i:i + chunk] = ys.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    return out


def decode_parallel(n: int, fill: Callable[[int], None], workers: int | None = None,
                    desc: str = "decode") -> None:
    """Call ``fill(i)`` for i in range(n) on ``workers`` threads (default: CPUs, <= 16), in chunks, with a
    progress bar above PROGRESS_MIN images. The first error stops the rest; a FolderError becomes a
    DataError."""
    workers = workers or min(16, os.cpu_count() or 1)
    step = max(1, min(DECODE_CHUNK, n // (4 * workers)))  # >= 4 tasks a thread for few, large images

    def chunk(start: int) -> int:
        stop = min(start + step, n)
        for i in range(start, stop):
            fill(i)
        return stop - start

    with ThreadPoolExecutor(workers) as pool, tqdm(total=n, desc=desc, unit="img",
                                                    disable=n <= PROGRESS_MIN) as bar:
        try:
            for done in pool.map(chunk, range(0, n, step)):
                bar.update(done)
        except (FolderError, DataError) as e:
            pool.shutdown(cancel_futures=True)  # stop at the first unreadable file, not after all the rest
            raise DataError(str(e)) from e


def decode_images(paths: list[str], size: int, workers: int | None = None,
                  desc: str = "decode") -> torch.Tensor:
    """uint8 (N, size, size, 3) from image files, decoded on ``workers`` threads (default: CPUs, <= 16)."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)

    def fill(i: int) -> None:
        out[i] = load_image(paths[i], size)

    decode_parallel(len(paths), fill, workers, desc)
    return torch.from_numpy(out)


def _require_dir(path: str, what: str) -> None:
    if not os.path.isdir(path):
        problem = "is not a directory" if os.path.exists(path) else "does not exist"
        raise DataError(f"{what}: {path!r} {problem}")


# ---- CIFAR-10/100 (torchvision's python-pickle format) --------------------------------------------------


def read_cifar(name: str, root: str, size: int, download: bool) -> Loaded:
    """CIFAR-10 or CIFAR-100 through the torchvision classes (which check the files' md5 sums)."""
    from torchvision.datasets import CIFAR10, CIFAR100  # imported here: ~0.4 s, only CIFAR needs it

    cls = {"cifar10": CIFAR10, "cifar100": CIFAR100}[name]
    folder = os.path.join(os.path.expanduser(root), cls.base_folder)
    hint = f"extract {cls.filename} ({cls.url}) into {root!r}, or pass --download to fetch it"
    if not download and not os.path.isdir(folder):
        raise DataError(f"{name}: expected the files in {folder!r}, which does not exist; {hint}")
    try:
        train = cls(os.path.expanduser(root), train=True, download=download)
        test = cls(os.path.expanduser(root), train=False, download=False)
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted" (a file missing or bad md5)
        raise DataError(f"{name}: files in {folder!r} are missing or corrupted ({e}); {hint}") from e
    except OSError as e:  # a failed download (URLError is an OSError) or an unreadable file
        raise DataError(f"{name}: cannot read or download into {folder!r}: {e}") from e

    def images(ds) -> torch.Tensor:
        return resize_uint8(torch.from_numpy(np.ascontiguousarray(ds.data)), size)  # (N, 32, 32, 3) HWC

    return Loaded(images(train), _labels(train.targets), images(test), _labels(test.targets),
                  list(train.classes))


# ---- Tiny-ImageNet (tiny-imagenet-200/) -------------------------------------------------------------------


def read_tinyimagenet(root: str, size: int, workers: int | None = None) -> Loaded:
    """``tiny-imagenet-200/``: train/<wnid>/images/*.JPEG; its val split (val_annotations.txt) is our test.

    ``root`` is the folder itself or its parent. Labels follow the order of wnids.txt; class names are wnids.
    """
    root = os.path.expanduser(root)
    inside = os.path.isfile(os.path.join(root, "wnids.txt"))
    base = root if inside else os.path.join(root, "tiny-imagenet-200")
    if not os.path.isfile(os.path.join(base, "wnids.txt")):
        raise DataError(f"tinyimagenet: no wnids.txt in {root!r} nor in {base!r}; unzip "
                        f"tiny-imagenet-200.zip (http://cs231n.stanford.edu/tiny-imagenet-200.zip) there")
    with open(os.path.join(base, "wnids.txt")) as f:
        wnids = [line.strip() for line in f if line.strip()]
    index = {w: i for i, w in enumerate(wnids)}
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
    test_paths, test_labels = [], []
    with open(annotations) as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 2 or fields[1] not in index:
                raise DataError(f"tinyimagenet: {annotations}:{n}: expected 'FILE WNID ...' with a wnid of "
                                f"wnids.txt, got {line.strip()!r}")
            test_paths.append(os.path.join(base, "val", "images", fields[0]))
            test_labels.append(index[fields[1]])
    return Loaded(decode_images(train_paths, size, workers, "tinyimagenet train"), _labels(train_labels),
                  decode_images(test_paths, size, workers, "tinyimagenet test"), _labels(test_labels), wnids)


# ---- iNaturalist-GEO (Hsu et al. 2020 client split CSV + iNaturalist-2017 images) -------------------------


def _column(header: list[str], names: tuple[str, ...], what: str, csv_path: str, required: bool = True):
    for name in names:
        if name in header:
            return name
    if required:
        raise DataError(f"inat-geo: {csv_path!r} has no {what} column; its header is {','.join(header)!r}, "
                        f"accepted names: {', '.join(names)}")
    return None


def _ids(values: list[str]) -> tuple[list[int], list[str]]:
    """Map values to 0..K-1 in sorted order (numeric when all are integers); returns (indices, names)."""
    unique = set(values)
    numeric = all(v.lstrip("-").isdigit() for v in unique)
    names = sorted(unique, key=int) if numeric else sorted(unique)
    index = {v: i for i, v in enumerate(names)}
    return [index[v] for v in values], names


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
            for folder, _, names in sorted(os.walk(root, followlinks=True)):
                for name in sorted(names):
                    if is_image(name):
                        stems.setdefault(os.path.splitext(name)[0], os.path.join(folder, name))
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
    if not os.path.isfile(split_csv):
        raise DataError(f"inat-geo: split CSV {split_csv!r} does not exist")
    root = os.path.expanduser(root)
    _require_dir(root, "inat-geo image root (--data-root)")
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
        test = _holdout(images, clients)
    else:
        split = [v.lower() for v in col(split_col)]
        if set(split) - {"train", "test"}:
            raise DataError(f"inat-geo: the {split_col!r} column must hold train or test, got "
                            f"{sorted(set(split) - {'train', 'test'})[:3]}")
        test = [v == "test" for v in split]
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
    return Loaded(decode_images([paths[i] for i in tr], size, workers, "inat-geo train"),
                  _labels([labels[i] for i in tr]),
                  decode_images([paths[i] for i in te], size, workers, "inat-geo test"),
                  _labels([labels[i] for i in te]), classes, _labels(client_ids))


# ---- a labelled image folder: ROOT/train/<class>/, ROOT/test/<class>/ -------------------------------------


def read_imagefolder(root: str, size: int, workers: int | None = None) -> Loaded:
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
    return Loaded(decode_images(train_paths, size, workers, "imagefolder train"), _labels(train_labels),
                  decode_images(test_paths, size, workers, "imagefolder test"), _labels(test_labels), classes)


# ---- Cityscapes (leftImg8bit/ + gtFine/, fine annotations; Table 5) --------------------------------------

CITYSCAPES_LAYOUT = ("ROOT/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png and "
                     "ROOT/gtFine/{train,val}/<city>/*_gtFine_labelIds.png")
CITYSCAPES_SUFFIX = "_leftImg8bit.png"  # every image name ends so; the label's is _gtFine_labelIds.png
IGNORE_ID = 255  # train id of the classes not evaluated (Cordts et al., CVPR 2016: 19 of 34 classes)


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


def _stored_width(path: str, height: int) -> int:
    """The width that keeps the image's aspect at ``height`` px (2048 x 1024 sources: 2 x height)."""
    with Image.open(path) as img:
        w, h = img.size
    return max(1, round(height * w / h))


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
    W), label ids resized nearest then mapped through ``lut``; W keeps the aspect of the first image, and
    every other image must come out the same."""
    try:
        width = _stored_width(images[0], height)
    except Exception as e:  # any failure to read the header is a problem with this file
        raise DataError(f"cityscapes: cannot read {images[0]!r}: {type(e).__name__}: {e}") from e
    x = np.empty((len(images), height, width, 3), dtype=np.uint8)
    y = np.empty((len(images), height, width), dtype=np.uint8)

    def fill(i: int) -> None:
        with _open(images[i]) as img, _open(labels[i]) as ids:
            (w, h), (lw, lh) = img.size, ids.size
            if (lw, lh) != (w, h):
                raise DataError(f"cityscapes: label {labels[i]!r} is {lw}x{lh} px (W x H) but its image "
                                f"is {w}x{h}")
            if max(1, round(height * w / h)) != width:
                raise DataError(f"cityscapes: {images[i]!r} ({w}x{h}) has another aspect than "
                                f"{images[0]!r}; all images of a split must store at {width}x{height}")
            x[i] = np.asarray(img.convert("RGB").resize((width, height), Image.Resampling.BILINEAR))
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

    ``store_size`` is the stored HEIGHT; the width keeps the source aspect (1024 x 2048 sources: 2 x).
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
