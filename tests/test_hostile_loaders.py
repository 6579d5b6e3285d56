"""Issue 42: the hostile-value table over the loaders' real formats, generated.

The pickled formats (CIFAR-10 and CIFAR-100 as torchvision publishes them, down-sampled ImageNet as
Chrabaszcz et al. 2017 publish it) are written whole and valid, then one training batch's ``data`` or labels
entry is replaced by each value in the tables below: other dtypes (narrower, wider, signed, floating, bool,
text), other shapes (flat, image-shaped, one column short, no rows, a column of labels), values out of range
(pixels of 256 or -1, labels below 0 or past the classes, beyond int64, NaN), plain lists, ragged lists,
None, and the entry missing. Each case must either load into what the format promises (uint8 (N, 32, 32, 3)
images, int64 labels within the classes, one per image) or raise the loader's own error (one line, which the
commands print with exit 2), never another exception. The table prints its counts.
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from federated.datasets import DataConfig, DataError, load_dataset
from pretrain.folder import FolderError
from pretrain.imagenet32 import read_imagenet32
from recipes.smoke_data import py2_dump, write_cifar, write_imagenet32

from .hostile_table import run_table, write_valid

N = 20  # rows of the batch that is made hostile (recipes.smoke_data's per-file count)


def _data_values(n: int) -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    good = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
    return {
        "int16 within 0..255": lambda: good.astype(np.int16),
        "int16 of 300 (wraps to 44 as uint8)": lambda: np.full((n, 3072), 300, np.int16),
        "int64 of -1": lambda: np.full((n, 3072), -1, np.int64),
        "uint16 of 65535": lambda: np.full((n, 3072), 65535, np.uint16),
        "float32 in 0..1": lambda: good.astype(np.float32) / 255,
        "float64 with NaN": lambda: np.full((n, 3072), np.nan),
        "bool": lambda: good > 127,
        "text": lambda: good.astype(str),
        "a list of lists": lambda: good.tolist(),
        "a ragged list": lambda: [list(range(3072)), [0]] * (n // 2),
        "flat (N * 3072,)": lambda: good.reshape(-1),
        "image-shaped (N, 3, 32, 32)": lambda: good.reshape(n, 3, 32, 32),
        "one column short (N, 3071)": lambda: good[:, :-1],
        "no rows (0, 3072)": lambda: good[:0],
        "None": lambda: None,
        "a string": lambda: "data",
    }


def _label_values(n: int, lo: int, classes: int) -> dict[str, Callable[[], object]]:
    ids = [lo + i % classes for i in range(n)]
    return {
        "int8 array": lambda: np.asarray(ids, np.int8),
        "below the first class": lambda: [lo - 1] * n,
        "past the last class": lambda: [lo + classes] * n,
        "past the format's classes (200000)": lambda: [200_000] * n,
        "beyond int64 (2**70)": lambda: [2**70] * n,
        "floats": lambda: [float(y) for y in ids],
        "NaN": lambda: [float("nan")] * n,
        "text": lambda: [str(y) for y in ids],
        "bool": lambda: [True] * n,
        "a column (N, 1)": lambda: np.asarray(ids)[:, None],
        "one short (N - 1)": lambda: ids[:-1],
        "one too many (N + 1)": lambda: [*ids, lo],
        "a ragged list": lambda: [[y] if i % 2 else [y, y] for i, y in enumerate(ids)],
        "None": lambda: None,
        "a string": lambda: "labels",
    }


@dataclass(frozen=True)
class Format:
    """A real on-disk format: how to write it valid, which file and keys a case replaces, how to load it,
    and the error it must raise."""

    name: str
    write: Callable[[Path], None]
    batch: str  # the file, relative to the root, that a case makes hostile
    label_key: str
    first_label: int  # 0-based ids (CIFAR) or 1-based (ImageNet32)
    classes: int  # the classes the written data uses
    format_classes: int  # the classes the format allows (its label range)
    load: Callable[[Path], tuple[np.ndarray, np.ndarray]]  # images (N, 32, 32, 3), labels
    error: type[Exception]
    py2: bool  # the published pickles are Python 2's (bytes keys)


def _cifar_load(name: str) -> Callable[[Path], tuple[np.ndarray, np.ndarray]]:
    def load(root: Path) -> tuple[np.ndarray, np.ndarray]:
        data = load_dataset(DataConfig(name, root=str(root), val_fraction=0))
        return data.train_x.numpy(), data.train_y.numpy()
    return load


FORMATS = {f.name: f for f in (
    Format("cifar10", lambda r: write_cifar(r, hundred=False), "cifar-10-batches-py/data_batch_2",
           "labels", 0, 10, 10, _cifar_load("cifar10"), DataError, True),
    Format("cifar100", lambda r: write_cifar(r, hundred=True), "cifar-100-python/train", "fine_labels", 0,
           100, 100, _cifar_load("cifar100"), DataError, True),
    Format("imagenet32", lambda r: write_imagenet32(r, per_batch=N, classes=10, val=4), "train_data_batch_2",
           "labels", 1, 10, 1000, lambda r: read_imagenet32(str(r)), FolderError, False),
)}


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    for fmt in FORMATS.values():
        cases += [(fmt.name, "data", v) for v in [*_data_values(N), "missing"]]
        cases += [(fmt.name, "labels", v) for v in [*_label_values(N, fmt.first_label, fmt.classes),
                                                    "missing"]]
    return cases


CASES = _cases()


def _make_hostile(root: Path, fmt: Format, field: str, value_name: str) -> None:
    path = root / fmt.batch
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="bytes") if fmt.py2 else pickle.load(f)  # our own file: trusted
    key = ("data" if field == "data" else fmt.label_key)
    key = key.encode() if fmt.py2 else key
    if value_name == "missing":
        del entry[key]
    else:
        table = _data_values(N) if field == "data" else _label_values(N, fmt.first_label, fmt.classes)
        entry[key] = table[value_name]()
    if fmt.py2:
        py2_dump(entry, path)
    else:
        path.write_bytes(pickle.dumps(entry, protocol=2))


def _outcome(root: Path, fmt: Format) -> str:
    """'refused' (the loader's one-line error) or 'loaded' (checked against what the format promises);
    any other exception propagates: a traceback for the user, a failure here."""
    try:
        images, labels = fmt.load(root)
    except fmt.error as exc:
        assert "\n" not in str(exc).strip(), f"a refusal of more than one line: {exc}"
        return "refused"
    assert images.dtype == np.uint8 and images.ndim == 4 and images.shape[1:] == (32, 32, 3), images.shape
    assert labels.dtype == np.int64 and labels.shape == (len(images),), (labels.dtype, labels.shape)
    assert labels.min() >= 0 and labels.max() < fmt.format_classes, (labels.min(), labels.max())
    return "loaded"


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, Path]:
    """Each format written once, valid; a case copies it and changes one entry."""
    return write_valid(tmp_path_factory, FORMATS.values())


def test_every_valid_format_loads(valid, skip_md5):
    for fmt in FORMATS.values():
        assert _outcome(valid[fmt.name], fmt) == "loaded"


def test_the_hostile_loader_table(valid, skip_md5, tmp_path):
    def outcome(case: tuple[str, str, str]) -> str:
        name, field, value = case
        root = tmp_path / "case"  # one case at a time, removed after it
        try:
            shutil.copytree(valid[name], root)
            _make_hostile(root, FORMATS[name], field, value)
            return _outcome(root, FORMATS[name])
        finally:
            shutil.rmtree(root)

    counts = run_table(CASES, lambda case: f"{case[0]:10} {case[1]:6} {case[2]:38}", outcome)
    assert counts["refused"] >= len(CASES) // 2  # the table is hostile: most cases must be refused
