"""Node-local data: one shard per client and a manifest, for a Flower deployment where the data stays on each
node (Beutel et al. 2020; the partitions of Chen et al., ICLR 2023, §4.2).

``federate export-partitions`` draws the run's partition once (:func:`federated.setup.partitioned`, the
in-process engine's code) and writes, per client, ``client-NNNN.npz`` (``x``: its training images, uint8
(n, S, S, 3) as the dataset holds them; ``y``: their labels; ``index``: their positions in the full training
set, in partition order), then ``manifest.json``: the settings that decide the partition (dataset, seed,
partition and its settings, clients, ...), every client's size and class counts (FedIR's and FedVC's server
knowledge, which a client's step also reads), the dataset's shape facts, and each shard's sha256. The
manifest is written last, so an interrupted export has none.

A SuperNode started with ``--node-config "partition-id=I data-dir=DIR"`` loads only ``DIR``'s shard ``I``
(:func:`load_shard`, which checks it against the manifest; it never loads the test set) and reports the
shard's sha256 in every reply; the server, given the same manifest (run config ``shards``), checks that the
manifest is the run's partition (:func:`check_manifest`) and every reply's hash against it. The sha256 is of
the arrays x, y and index (dtype, shape, bytes), not of the .npz file, whose zip headers carry timestamps.
An export never replaces another's manifest: a directory that holds one is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fpsfl.base.files import LockedError, atomic_write, clean_stale, lock_file, unlock_file

from .datasets import ImageData, split_settings

FORMAT = "fpsfl-shards/2"  # /2: the sha256 covers the index array too
MANIFEST = "manifest.json"
# the FederateConfig fields that decide which samples a client holds (the partition's settings, its
# resolved min_size and the datasets' split settings, e.g. inat-geo's split_csv, come on top)
DATA_FIELDS = ("dataset", "store_size", "val_fraction", "seed", "partition", "clients")


class ShardError(ValueError):
    """A shard or manifest that does not belong to the run (one line, exit code 2)."""


@dataclass
class Shard:
    """One client's node-local data: its training set, where each sample sits in the full training set,
    and the manifest it came from."""

    client: int
    data: ImageData  # the client's samples as the training set; test and validation sets empty
    index: torch.Tensor  # int64 (n,): the samples' positions in the full training set, in partition order
    sha256: str
    manifest: dict

    def to_local(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions in the full training set (a pool the server drew, FedVC) as positions in this shard."""
        order = torch.argsort(self.index)
        at = torch.searchsorted(self.index[order], positions.cpu())
        at = at.clamp(max=len(order) - 1)
        if not torch.equal(self.index[order][at], positions.cpu()):
            raise ShardError(f"client {self.client}: the server asked for samples its shard does not hold")
        return order[at]


def partition_settings(cfg: Any) -> dict:
    """What decides a client's samples: :data:`DATA_FIELDS`, the datasets' split settings and the
    partition's own settings (a dict that JSON round-trips, so a manifest read back compares equal)."""
    settings = {name: getattr(cfg, name) for name in (*DATA_FIELDS, *split_settings())}
    settings["min_size"] = cfg.partition_config().min_size  # the field's None means the partition's default
    settings.update(cfg.partition_args)
    return json.loads(json.dumps(settings))


def shard_digest(*arrays: np.ndarray) -> str:
    """sha256 of a shard's arrays (x, y, index): their dtypes, shapes and bytes. The index is covered: an
    edited one would map the server's sample pools (FedVC) to other samples."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def shard_name(client: int) -> str:
    return f"client-{client:04d}.npz"


def export_shards(out: Path, settings: dict, data: ImageData, parts: list[torch.Tensor],
                  class_counts: np.ndarray, progress=None) -> dict:
    """Write one shard per client of ``parts`` (positions in ``data``'s training set) and the manifest into
    ``out``; returns the manifest. ``progress`` (a tqdm) is advanced once per shard."""
    lock = check_export_dir(out) / ".lock"
    try:
        fd = lock_file(lock, f"{out} is being written by process {{holder}} (another export)")
    except (LockedError, OSError) as exc:
        raise ShardError(str(exc) if isinstance(exc, LockedError) else f"cannot write in --out {out}: "
                         f"{exc.strerror or exc}") from None
    try:
        check_export_dir(out)  # again, under the lock
        clean_stale(out, _SHARD_FILES, recursive=False)  # of an export killed before its rename
        return _export(out, settings, data, parts, class_counts, progress)
    finally:
        unlock_file(lock, fd)


_SHARD_FILES = re.compile(rf"client-\d+\.npz|{re.escape(MANIFEST)}")


def check_export_dir(out: Path) -> Path:
    """``out`` made and writable, without a manifest (an interrupted export's shards, which have none, are
    replaced); ShardError otherwise. Returns ``out``."""
    if out.exists() and not out.is_dir():
        raise ShardError(f"--out {out} is a file, not a folder for the shards")
    if (out / MANIFEST).exists():
        raise ShardError(f"--out {out} already holds an export ({MANIFEST}); choose another --out or remove "
                         f"it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShardError(f"cannot write in --out {out}: {exc.strerror or exc}") from None
    return out


def _export(out: Path, settings: dict, data: ImageData, parts: list[torch.Tensor], class_counts: np.ndarray,
            progress) -> dict:
    shards = []
    for client, part in enumerate(parts):
        x, y = data.train_x[part].cpu().numpy(), data.train_y[part].cpu().numpy()
        index = part.cpu().numpy().astype(np.int64)
        name = shard_name(client)
        atomic_write(out / name, partial(_savez, x=x, y=y, index=index))
        shards.append({"client": client, "file": name, "samples": int(len(part)),
                       "sha256": shard_digest(x, y, index)})
        if progress is not None:
            progress.update(1)
    manifest = {"format": FORMAT, "settings": settings, "sizes": [int(len(p)) for p in parts],
                "class_counts": np.asarray(class_counts).astype(int).tolist(), "n_classes": data.n_classes,
                "classes": list(data.classes), "input_size": data.input_size, "hflip": data.hflip,
                "task": data.task, "shards": shards}
    atomic_write(out / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))
    return manifest


def _savez(path: Path, **arrays: np.ndarray) -> None:
    """``arrays`` as an .npz file at ``path`` (the temporary name :func:`atomic_write` gives)."""
    with path.open("wb") as f:  # a file object: np.savez would append .npz to the temporary name
        np.savez(f, **arrays)


def read_manifest(data_dir: Path | str) -> dict:
    """``data_dir``'s manifest (``data_dir`` may also name the manifest itself)."""
    path = Path(data_dir).expanduser()
    path = path if path.suffix == ".json" else path / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{path}: no shard manifest (write one with federate export-partitions)") from None
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: not a readable shard manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        older = " (an older export: export the partitions again)" if str(found).startswith("fpsfl-shards/") \
            else ""
        raise ShardError(f"{path}: not a {FORMAT} manifest{older}")
    return manifest


def load_shard(data_dir: Path | str, client: int) -> Shard:
    """Client ``client``'s shard from ``data_dir``, checked against the manifest's sha256."""
    manifest = read_manifest(data_dir)
    root = Path(data_dir).expanduser()
    root = root.parent if root.suffix == ".json" else root
    if not 0 <= client < len(manifest["shards"]):
        raise ShardError(f"{root}: the manifest has shards 0..{len(manifest['shards']) - 1}, not "
                         f"partition-id {client}")
    entry = manifest["shards"][client]
    try:
        with np.load(root / entry["file"]) as npz:
            x, y, index = npz["x"], npz["y"], npz["index"]
    except Exception as exc:  # truncated or bit-flipped: zipfile, zlib, EOF, pickle or key errors alike
        detail = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ShardError(f"{root / entry['file']}: not a readable shard (a changed or partly copied shard? "
                         f"{detail})") from None
    digest = shard_digest(x, y, index)
    if digest != entry["sha256"]:
        raise ShardError(f"{root / entry['file']}: its contents do not match the manifest's sha256 (a "
                         f"changed or partly copied shard)")
    empty_x = torch.zeros((0, *x.shape[1:]), dtype=torch.uint8)
    empty_y = torch.zeros((0, *y.shape[1:]), dtype=torch.from_numpy(y[:0]).dtype)
    data = ImageData(train_x=torch.from_numpy(x), train_y=torch.from_numpy(y), test_x=empty_x, test_y=empty_y,
                     val_x=empty_x, val_y=empty_y, n_classes=int(manifest["n_classes"]),
                     classes=list(manifest["classes"]), clients=None, input_size=int(manifest["input_size"]),
                     hflip=bool(manifest["hflip"]), task=str(manifest["task"]))
    return Shard(client, data, torch.from_numpy(index).long(), digest, manifest)


def check_manifest(manifest: dict, settings: dict, where: str,
                   sizes: list[int] | None = None) -> dict[int, str]:
    """Refuse (one line) a manifest that is not the run's partition: other settings, or (given ``sizes``,
    the server's partition) other client sizes; returns each client's shard sha256."""
    mine = json.loads(json.dumps(settings))
    theirs = manifest.get("settings", {})
    changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if changed:
        diffs = ", ".join(f"{k} {theirs.get(k)!r} (run: {mine.get(k)!r})" for k in changed)
        raise ShardError(f"{where}: the shards were exported with other settings: {diffs}")
    if sizes is not None and list(manifest.get("sizes", [])) != list(sizes):
        raise ShardError(f"{where}: the shards' client sizes differ from the run's partition")
    return {int(e["client"]): str(e["sha256"]) for e in manifest["shards"]}

