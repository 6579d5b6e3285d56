"""Issue 42: the hostile-value table over the loaders' text and image formats, generated.

Tiny-ImageNet (wnids.txt, val/val_annotations.txt, JPEGs), iNaturalist-GEO (Hsu et al.'s split and test
CSVs, iNaturalist-2017's annotation JSON), Cityscapes (leftImg8bit PNGs and gtFine label-id PNGs) and a
labelled image folder are written whole and valid by ``recipes/smoke_data.py``, then one entry is made
hostile: text files with blank lines, duplicates, unknown names, missing or extra columns, non-UTF-8 bytes,
paths escaping their folder, or nothing at all; images that are text, truncated, empty, grey, transparent,
16-bit, float, 1 x 1, of another size or aspect; labels outside the label map, of three channels, missing.
Each case must either load into what the format promises (uint8 (N, S, S, 3) images at the promised side,
int64 labels within distinct classes, one per image; Cityscapes: (N, H, W, 3) images and (N, H, W) train
ids) or raise the loader's own :class:`DataError` in one line (which the commands print with exit 2), never
another exception. Folder formats are loaded both in memory and streamed (``decode="stream"``); streamed
images are decoded batch by batch, as training would, so a file that only fails when decoded is exercised.
The table prints its counts.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from federated.datasets import DataConfig, DataError, StreamedImages, load_dataset
from federated.datasets.cityscapes import IGNORE_ID
from federated.datasets.stream import fetch
from recipes.smoke_data import noisy, write_cityscapes, write_imagefolder, write_inat_geo, write_tiny

from .hostile_table import run_table, write_valid

BATCH = 16  # images per streamed batch
NON_UTF8 = b"\xff\xfe\xfa"


def _image(mode: str, wh: tuple[int, int] = (12, 9), fmt: str = "PNG") -> bytes:
    """An image file's bytes in PIL ``mode``."""
    rgb = noisy(1, wh, np.random.default_rng(0))
    img = {"I;16": lambda: Image.fromarray(np.asarray(rgb.convert("L"), np.uint16) * 257),
           "F": lambda: rgb.convert("L").convert("F"),
           "P+transparency": lambda: rgb.convert("P")}.get(mode, lambda: rgb.convert(mode))()
    buf = io.BytesIO()
    img.save(buf, fmt, **({"transparency": 0} if mode == "P+transparency" else {}))
    return buf.getvalue()


def _truncated(fmt: str, wh: tuple[int, int]) -> bytes:
    whole = _image("RGB", (max(wh[0], 64), max(wh[1], 64)), fmt)
    return whole[:len(whole) // 2]


# what an image file can hold, drawn at a given (width, height)
IMAGE_BODIES: dict[str, Callable[[tuple[int, int]], bytes]] = {
    "text bytes": lambda wh: b"this is not an image\n",
    "0 bytes": lambda wh: b"",
    "a truncated PNG": lambda wh: _truncated("PNG", wh),
    "a truncated JPEG": lambda wh: _truncated("JPEG", wh),
    "grayscale (L)": lambda wh: _image("L", wh),
    "RGBA": lambda wh: _image("RGBA", wh),
    "a palette with transparency": lambda wh: _image("P+transparency", wh),
    "16-bit grey (I;16)": lambda wh: _image("I;16", wh),
    "1-bit (mode 1)": lambda wh: _image("1", wh),
    "CMYK JPEG": lambda wh: _image("CMYK", wh, "JPEG"),
    "32-bit float TIFF (F)": lambda wh: _image("F", wh, "TIFF"),
    "1 x 1 px": lambda wh: _image("RGB", (1, 1)),
}


def _bodies(path: str, wh: tuple[int, int]) -> dict[str, Callable[[Path], None]]:
    """A case per entry of IMAGE_BODIES: the file at ``path`` replaced by it."""
    def replace(body: Callable[[tuple[int, int]], bytes]) -> Callable[[Path], None]:
        return lambda r: _write(r / path, body(wh))
    return {f"an image: {k}": replace(body) for k, body in IMAGE_BODIES.items()}


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _empty(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()


def _edit(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    """Rewrite a text file line by line."""
    path.write_text("\n".join(change(path.read_text().splitlines())) + "\n")


# ---- Tiny-ImageNet -----------------------------------------------------------------------------------------

TINY = "tiny-imagenet-200"
TINY_IMAGE = f"{TINY}/train/n01/images/n01_0.JPEG"
ANNOTATIONS = f"{TINY}/val/val_annotations.txt"


def _val_line(name: str, wnid: str = "n01") -> Callable[[list[str]], list[str]]:
    return lambda lines: [*lines, f"{name}\t{wnid}\t0\t0\t63\t63"]


TINY_CASES: dict[str, Callable[[Path], None]] = {
    "wnids.txt with blank lines": lambda r: _write(r / TINY / "wnids.txt", "\n\nn03\n\n n01\n\n\nn02\n\n"),
    "wnids.txt with CRLF line ends": lambda r: _write(r / TINY / "wnids.txt", "n03\r\nn01\r\nn02\r\n"),
    "wnids.txt with a duplicate": lambda r: _write(r / TINY / "wnids.txt", "n03\nn01\nn02\nn01\n"),
    "wnids.txt with an unknown id": lambda r: _write(r / TINY / "wnids.txt", "n03\nn01\nn02\nn99\n"),
    "wnids.txt not UTF-8": lambda r: _write(r / TINY / "wnids.txt", b"n03\nn01" + NON_UTF8 + b"\nn02\n"),
    "wnids.txt empty": lambda r: _write(r / TINY / "wnids.txt", ""),
    "wnids.txt blank lines only": lambda r: _write(r / TINY / "wnids.txt", "\n \n\n"),
    "val_annotations.txt: too few columns": lambda r: _edit(r / ANNOTATIONS, _val_line("val_0.JPEG", "")),
    "val_annotations.txt: an unknown wnid": lambda r: _edit(r / ANNOTATIONS, _val_line("val_0.JPEG", "n99")),
    "val_annotations.txt: no such file": lambda r: _edit(r / ANNOTATIONS, _val_line("nope.JPEG")),
    "val_annotations.txt: a path escaping val/images": lambda r: (  # to a file that exists
        _write(r / TINY / "val/x.JPEG", _image("RGB", (64, 64), "JPEG")), _edit(r / ANNOTATIONS,
                                                                                 _val_line("../x.JPEG"))),
    "val_annotations.txt: an absolute path": lambda r: _edit(r / ANNOTATIONS, _val_line(
        str((r / TINY_IMAGE).resolve()))),
    "val_annotations.txt: a file listed twice": lambda r: _edit(r / ANNOTATIONS, _val_line("val_0.JPEG")),
    "val_annotations.txt: blank lines": lambda r: _edit(r / ANNOTATIONS, lambda ls: ["", *ls, "  ", ""]),
    "val_annotations.txt not UTF-8": lambda r: _write(r / ANNOTATIONS, (r / ANNOTATIONS).read_bytes()
                                                      + b"val_0.JPEG\tn01" + NON_UTF8 + b"\n"),
    "val_annotations.txt empty": lambda r: _write(r / ANNOTATIONS, ""),
    "a class folder without images": lambda r: _empty(r / TINY / "train/n02/images"),
    **_bodies(TINY_IMAGE, (64, 64)),
    "a test image: a truncated JPEG": lambda r: _write(r / TINY / "val/images/val_1.JPEG",
                                                       _truncated("JPEG", (64, 64))),
}


# ---- iNaturalist-GEO ---------------------------------------------------------------------------------------

SPLIT, TEST = "inaturalist-geo/federated_train_geo_3k.csv", "inaturalist-geo/test.csv"


def _csv(name: str, change: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    return lambda r: _edit(r / name, change)


def _column(i: int, value: str, row: int = 1) -> Callable[[list[str]], list[str]]:
    """Field ``i`` of line ``row`` set to ``value`` (quoted when it holds a comma)."""
    def change(lines: list[str]) -> list[str]:
        fields = lines[row].split(",")
        fields[i] = f'"{value}"' if "," in value else value
        return [*lines[:row], ",".join(fields), *lines[row + 1:]]
    return change


def _every_row(i: int, value: Callable[[str], str]) -> Callable[[list[str]], list[str]]:
    def change(lines: list[str]) -> list[str]:
        rows = [line.split(",") for line in lines[1:]]
        return [lines[0]] + [",".join(f[:i] + [value(f[i])] + f[i + 1:]) for f in rows]
    return change


def _drop(i: int) -> Callable[[list[str]], list[str]]:
    return lambda lines: [",".join(f for j, f in enumerate(line.split(",")) if j != i) for line in lines]


INAT_CASES: dict[str, Callable[[Path], None]] = {
    "split CSV without its client column": _csv(SPLIT, _drop(0)),
    "split CSV without its image column": _csv(SPLIT, _drop(1)),
    "split CSV without its class columns": _csv(SPLIT, lambda ls: _drop(2)(_drop(3)(ls))),
    "split CSV with an extra column": _csv(SPLIT, lambda ls: [f"{line},x" for line in ls]),
    "split CSV with a row one field short": _csv(SPLIT, lambda ls: [*ls, "cell00,000abc0"]),
    "split CSV: class names, not integers": _csv(SPLIT, _every_row(2, lambda v: f"sp{v}")),
    "split CSV: one class id not an integer": _csv(SPLIT, _column(2, "2.5")),
    "split CSV: integer client ids": _csv(SPLIT, _every_row(0, lambda v: str(int(v[4:])))),
    "split CSV: a negative class id": _csv(SPLIT, _column(2, "-1")),
    "split CSV: a class id of 10**12": _csv(SPLIT, _column(2, str(10**12))),
    "split CSV: a class id of 5,000 digits": _csv(SPLIT, _column(2, "9" * 5000)),
    "split CSV: client ids of 5,000 digits": _csv(SPLIT, _every_row(0, lambda v: v[4:] * 2500)),
    "split CSV: a negative client id": _csv(SPLIT, _column(0, "-3")),
    "split CSV: a client id of '--1'": _csv(SPLIT, _every_row(0, lambda v: "--1" if v == "cell00" else "7")),
    "split CSV: a class id of '\u00b2' (a digit int() rejects)": _csv(SPLIT, _column(2, "\u00b2")),
    "split CSV empty": lambda r: _write(r / SPLIT, ""),
    "split CSV header only": _csv(SPLIT, lambda ls: ls[:1]),
    "split CSV: an image id with no file": _csv(SPLIT, _column(1, "nosuchimage")),
    "split CSV: an empty image id": _csv(SPLIT, _column(1, "")),
    "split CSV: a duplicated row": _csv(SPLIT, lambda ls: [*ls, ls[1]]),
    "split CSV: one image under two labels": _csv(SPLIT, lambda ls: [*ls, _column(2, "5")(ls)[1]]),
    "split CSV not UTF-8": lambda r: _write(r / SPLIT, (r / SPLIT).read_bytes() + b"cell00,x" + NON_UTF8
                                            + b",1,1001\n"),
    "split CSV: a quoted client with a comma": _csv(SPLIT, _column(0, "cell, 00")),
    "split CSV with a UTF-8 byte-order mark": lambda r: _write(r / SPLIT, "\ufeff" + (r / SPLIT).read_text()),
    "split CSV with a split column of 'val'": _csv(SPLIT, lambda ls: [ls[0] + ",split"]
                                                   + [line + ",val" for line in ls[1:]]),
    "test CSV without its class columns": _csv(TEST, lambda ls: _drop(1)(_drop(2)(ls))),
    "test CSV header only": _csv(TEST, lambda ls: ls[:1]),
    "test CSV empty": lambda r: _write(r / TEST, ""),
    "test CSV: class names, not integers": _csv(TEST, _every_row(1, lambda v: f"sp{v}")),
    "test CSV: a negative class id": _csv(TEST, _column(1, "-1")),
    "test CSV: an image id with no file": _csv(TEST, _column(0, "nosuchimage")),
    "test CSV: an image of the split CSV": lambda r: _edit(r / TEST, lambda ls: [
        *ls, ",".join((r / SPLIT).read_text().splitlines()[1].split(",")[1:3]) + ",1000"]),
    "test CSV not UTF-8": lambda r: _write(r / TEST, (r / TEST).read_bytes() + b"val0001" + NON_UTF8
                                           + b",1,1001\n"),
    "train2017.json not JSON": lambda r: _write(r / "images/train2017.json", "{"),
    "train2017.json not UTF-8": lambda r: _write(r / "images/train2017.json", NON_UTF8),
    "train2017.json: images not a list": lambda r: _write(r / "images/train2017.json", '{"images": 3}'),
}


def _inat_copy(valid: Path, case: Path) -> dict:
    """Only the text files are copied; the images are shared (no case changes them)."""
    for name in (SPLIT, TEST, "images/train2017.json", "images/val2017.json"):
        _write(case / name, (valid / name).read_bytes())
    for entry in (valid / "images").iterdir():
        if entry.is_dir():
            (case / "images" / entry.name).symlink_to(entry)
    return {"root": str(case / "images"), "store_size": 32,
            "options": {"split_csv": str(case / SPLIT), "test_csv": str(case / TEST)}}


# ---- Cityscapes --------------------------------------------------------------------------------------------

CS_STEM = "leftImg8bit/train/aachen/aachen_000000_000019"
CS_IMAGE, CS_LABEL = f"{CS_STEM}_leftImg8bit.png", f"gtFine{CS_STEM[11:]}_gtFine_labelIds.png"


def _label(value: int, shape: tuple[int, ...] = (64, 128), dtype: type = np.uint8) -> bytes:
    """A label PNG holding ``value`` everywhere (H, W) or (H, W, 3)."""
    buf = io.BytesIO()
    Image.fromarray(np.full(shape, value, dtype)).save(buf, "PNG")
    return buf.getvalue()


CS_CASES: dict[str, Callable[[Path], None]] = {
    "a label of another size": lambda r: _write(r / CS_LABEL, _label(7, (32, 64))),
    "label ids outside the label map (250)": lambda r: _write(r / CS_LABEL, _label(250)),
    "a 16-bit label with ids past 255": lambda r: _write(r / CS_LABEL, _label(7000, dtype=np.uint16)),
    "an RGB label": lambda r: _write(r / CS_LABEL, _label(7, (64, 128, 3))),
    "a label that is text": lambda r: _write(r / CS_LABEL, "not a png"),
    "a missing label": lambda r: (r / CS_LABEL).unlink(),
    "an empty city folder": lambda r: (r / "leftImg8bit/train/bonn").mkdir(),
    "an empty city folder in gtFine": lambda r: (r / "gtFine/train/bonn").mkdir(),
    "a file where a city folder belongs": lambda r: _write(r / "leftImg8bit/train/README", "x"),
    "no val images": lambda r: shutil.rmtree(r / "leftImg8bit/val/frankfurt"),
    "an image of another aspect": lambda r: _write(r / CS_IMAGE, _image("RGB", (64, 64))),
    "an image and label of 1 x 1 px": lambda r: (_write(r / CS_IMAGE, _image("RGB", (1, 1))),
                                                 _write(r / CS_LABEL, _label(7, (1, 1)))),
    **_bodies(CS_IMAGE, (128, 64)),
}


# ---- image folder ------------------------------------------------------------------------------------------

FOLDER_IMAGE = "train/cat/0.png"


def _mixed_modes(root: Path) -> None:
    for path, mode in (("train/cat/0.png", "L"), ("train/dog/0.png", "RGBA"), ("train/eel/0.png", "I;16"),
                       ("test/cat/t.png", "P+transparency")):
        _write(root / path, _image(mode))


FOLDER_CASES: dict[str, Callable[[Path], None]] = {
    "a class folder with no images": lambda r: (r / "train/fox").mkdir(),
    "a class folder with a text file only": lambda r: _write(r / "train/fox/notes.txt", "x"),
    "a stray text file beside the images": lambda r: _write(r / "train/cat/notes.txt", "x"),
    "one class folder only": lambda r: [shutil.rmtree(r / "train" / c) for c in ("dog", "eel")],
    "a test class without a train folder": lambda r: _write(r / "test/fox/t.png", _image("RGB")),
    "a test folder without classes": lambda r: [shutil.rmtree(p) for p in (r / "test").iterdir()],
    "mixed image modes": _mixed_modes,
    "a file name not UTF-8": lambda r: _write(r / "train/cat" / os.fsdecode(b"x" + NON_UTF8 + b".png"),
                                              _image("RGB")),
    "a dangling link with an image name": lambda r: (r / "train/cat/gone.png").symlink_to(r / "nowhere.png"),
    **_bodies(FOLDER_IMAGE, (12, 9)),
    "an image of another size (40 x 30)": lambda r: _write(r / FOLDER_IMAGE, _image("RGB", (40, 30))),
}


# ---- the table ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    name: str  # the dataset's registry name
    write: Callable[[Path], None]
    cases: dict[str, Callable[[Path], None]]
    side: int  # the promised stored side (segmentation: height)
    decodes: tuple[str, ...] = ("memory", "stream")
    copy: Callable[[Path, Path], dict] | None = None  # (valid, case) -> DataConfig fields; default copytree


def _copytree(store_size: int | None) -> Callable[[Path, Path], dict]:
    def copy(valid: Path, case: Path) -> dict:
        shutil.copytree(valid, case, symlinks=True)
        return {"root": str(case), "store_size": store_size}
    return copy


FORMATS = {f.name: f for f in (
    Format("tinyimagenet", write_tiny, TINY_CASES, 64),
    Format("inat-geo", write_inat_geo, INAT_CASES, 32, ("auto",), _inat_copy),
    Format("cityscapes", write_cityscapes, CS_CASES, 32, ("memory",)),
    # no --store-size: the stored side is the folder's most common shorter side (its images: 12 x 9 px)
    Format("imagefolder", write_imagefolder, FOLDER_CASES, 9),
)}
# cases that loaded silently wrong before issue 42 (a class twice, a file outside the folder, an image under
# two labels or in both train and test, ids shifted by a negative one): they must be refused
MUST_REFUSE = {"wnids.txt with a duplicate", "val_annotations.txt: a path escaping val/images",
               "val_annotations.txt: an absolute path", "val_annotations.txt: a file listed twice",
               "split CSV: a negative class id", "test CSV: a negative class id",
               "split CSV: a duplicated row", "split CSV: one image under two labels",
               "test CSV: an image of the split CSV"}
CASES = [(f.name, case, decode) for f in FORMATS.values() for case in f.cases for decode in f.decodes]


def _decoded(x: torch.Tensor | StreamedImages) -> torch.Tensor:
    """The images as training sees them: streamed ones decoded batch by batch (in this process)."""
    if not isinstance(x, StreamedImages):
        return x
    x = dataclasses.replace(x, workers=0)
    got = list(fetch(x, [slice(i, i + BATCH) for i in range(0, len(x), BATCH)]))
    out = torch.cat(got) if got else torch.empty((0, *x.shape[1:]), dtype=torch.uint8)
    assert out.shape == x.shape, (out.shape, x.shape)
    return out


def _outcome(fmt: Format, cfg: dict, decode: str) -> str:
    """'refused' (a one-line DataError) or 'loaded' (checked against what the format promises); any other
    exception propagates: a traceback for the user, a failure here."""
    try:
        data = load_dataset(DataConfig(fmt.name, val_fraction=0, decode=decode, **cfg))
        splits = [(_decoded(data.train_x), data.train_y), (_decoded(data.test_x), data.test_y)]
    except DataError as exc:
        assert "\n" not in str(exc).strip(), f"a refusal of more than one line: {exc}"
        return "refused"
    assert data.n_classes == len(data.classes) == len(set(data.classes)) > 0, data.classes
    for x, y in splits:
        assert x.dtype == torch.uint8 and x.ndim == 4 and x.shape[1] == fmt.side and x.shape[3] == 3, x.shape
        assert len(x) > 0, "an empty split"
        if data.task == "segmentation":
            assert y.dtype == torch.uint8 and y.shape == x.shape[:3], (y.dtype, y.shape)
            assert set(y.unique().tolist()) <= set(range(data.n_classes)) | {IGNORE_ID}
        else:
            assert x.shape[2] == fmt.side, x.shape
            assert y.dtype == torch.int64 and y.shape == (len(x),), (y.dtype, y.shape)
            assert 0 <= y.min() and y.max() < data.n_classes, (y.min(), y.max(), data.n_classes)
    if data.clients is not None:
        assert data.clients.dtype == torch.int64 and data.clients.shape == data.train_y.shape[:1]
        assert data.clients.min() >= 0
    return "loaded"


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, Path]:
    """Each format written once, valid; a case copies it and changes one file."""
    return write_valid(tmp_path_factory, FORMATS.values())


def _run(valid: dict[str, Path], tmp: Path, name: str, case: str, decode: str, i: int) -> str:
    fmt = FORMATS[name]
    root = tmp / f"case{i}"
    cfg = (fmt.copy or _copytree(None if name == "imagefolder" else fmt.side))(valid[name], root)
    if case:
        fmt.cases[case](root)
    try:
        return _outcome(fmt, cfg, decode)
    finally:
        shutil.rmtree(root)


def test_every_valid_format_loads(valid, tmp_path):
    for i, (name, fmt) in enumerate(FORMATS.items()):
        for decode in fmt.decodes:
            assert _run(valid, tmp_path, name, "", decode, i) == "loaded", (name, decode)


def test_the_hostile_format_table(valid, tmp_path):
    assert MUST_REFUSE <= {case for _, case, _ in CASES}

    def outcome(numbered: tuple[int, tuple[str, str, str]]) -> str:
        i, (name, case, decode) = numbered
        result = _run(valid, tmp_path, name, case, decode, i)
        if case in MUST_REFUSE and result == "loaded":
            return "TRACEBACK none: loaded, but must be refused"
        return result

    counts = run_table(list(enumerate(CASES)), lambda n: f"{n[1][0]:12} {n[1][2]:6} {n[1][1]:52}", outcome)
    assert counts["refused"] >= len(CASES) // 3  # the table is hostile: many cases must be refused
