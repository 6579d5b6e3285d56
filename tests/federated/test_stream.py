"""Streamed datasets (federate --decode): images decoded from their files batch by batch by DataLoader
workers give exactly the in-memory path's bytes, rounds and evaluations; iNat-GEO reads iNaturalist's json
index and Hsu et al.'s test.csv, and streams by default."""

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from federated.datasets import DataConfig, DataError, StreamedImages, load_dataset
from federated.datasets.stream import chunks, fetch, wants_stream
from federated.experiment import FederateConfig
from federated.rounds import train_round
from federated.setup import setup
from fpsfl.base.rundir import RunDir
from recipes.smoke_data import noisy, write_inat_geo, write_tiny

CPU = torch.device("cpu")


def _tiny(tmp_path, decode: str, val_fraction: float = 0.2):
    if not (tmp_path / "tiny-imagenet-200").exists():
        rng = np.random.default_rng(0)
        write_tiny(tmp_path, wnids=["n1", "n2", "n3"], per_class=8, val_labels=[0, 1, 2, 0, 1, 2],
                   image=lambda k, c: noisy(c, (20, 24), rng))
    return load_dataset(DataConfig("tinyimagenet", root=str(tmp_path), store_size=16, decode=decode,
                                   val_fraction=val_fraction, seed=1))


def test_streamed_images_decode_to_the_in_memory_bytes(tmp_path):
    memory, stream = _tiny(tmp_path, "memory"), _tiny(tmp_path, "stream")
    assert isinstance(stream.train_x, StreamedImages) and isinstance(memory.train_x, torch.Tensor)
    for name in ("train_x", "val_x", "test_x"):  # the validation split is a subset of the same files
        a, b = getattr(memory, name), getattr(stream, name)
        assert b.shape == a.shape and b.dtype == torch.uint8 and len(b) == len(a) > 0
        assert torch.equal(b[:], a)
    assert torch.equal(stream.train_y, memory.train_y) and stream.clients is memory.clients is None
    pick = torch.tensor([5, 0, 5, 2])
    assert torch.equal(stream.train_x[pick], memory.train_x[pick]) and torch.equal(stream.train_x[3],
                                                                                   memory.train_x[3])
    assert torch.equal(stream.train_x.subset(pick)[:], memory.train_x[pick])
    batches = [torch.tensor([1, 2]), torch.tensor([7, 0, 3]), slice(4, 6)]
    for got, index in zip(fetch(stream.train_x, batches), batches, strict=True):
        assert torch.equal(got, memory.train_x[index])
    pairs = list(chunks(stream.test_x, stream.test_y, 4))
    assert [len(x) for x, _ in pairs] == [4, 2]
    assert torch.equal(torch.cat([x for x, _ in pairs]), memory.test_x)


@pytest.mark.parametrize("k", [1, 3])  # one client after another, and the vectorised engine
def test_a_round_on_streamed_images_equals_one_in_memory(tmp_path, k):
    cfg = FederateConfig(dataset="tinyimagenet", arch="resnet20", width=0.25, clients=3, rounds=1,
                         local_epochs=2, batch_size=5, min_size=1, client_batch=k, alpha=1.0)
    states = []
    for decode in ("memory", "stream"):
        s = setup(cfg, CPU, _tiny(tmp_path, decode))
        row = train_round(s, cfg, 0, CPU, RunDir(tmp_path / f"{decode}{k}"), None)
        states.append((s.model.state_dict(), row))
    (a, ra), (b, rb) = states
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert {n: ra[n] for n in ("test_acc", "test_loss", "train_loss", "local_accs")} == \
        {n: rb[n] for n in ("test_acc", "test_loss", "train_loss", "local_accs")}


def _ids_from_json(root: Path, csvs: list[str]) -> None:
    """Rewrite the split CSVs with iNaturalist's numeric image ids and rename every image file, so that
    only train2017.json / val2017.json can say which file an id is."""
    index = {}
    for name in ("train2017.json", "val2017.json"):
        path = root / name
        record = json.loads(path.read_text())
        for image in record["images"]:
            old = root / image["file_name"]
            image["file_name"] = str(Path(image["file_name"]).with_name(f"renamed-{image['id']}.jpg"))
            old.rename(root / image["file_name"])
            index[old.stem] = str(image["id"])
        path.write_text(json.dumps(record))
    for name in csvs:
        with open(name, newline="") as f:
            rows = list(csv.reader(f))
        column = rows[0].index("image_id")
        with open(name, "w", newline="") as f:
            csv.writer(f).writerows([rows[0]] + [r[:column] + [index[r[column]]] + r[column + 1:]
                                                 for r in rows[1:]])


def test_inat_geo_reads_the_json_index_and_test_csv_and_streams_by_default(tmp_path):
    files = write_inat_geo(tmp_path / "inat", n_classes=6)
    _ids_from_json(Path(files["images"]), [files["geo10k"], files["geo3k"], files["test"]])
    cfg = DataConfig("inat-geo", root=files["images"], options={"split_csv": files["geo10k"],
                                                               "test_csv": files["test"]},
                     val_fraction=0, store_size=16)
    data = load_dataset(cfg)
    assert isinstance(data.train_x, StreamedImages) and isinstance(data.test_x, StreamedImages)
    assert len(data.train_y) == 128 and len(data.test_y) == 48  # every split row trains; test.csv tests
    assert data.clients.unique().tolist() == list(range(8)) and data.n_classes == 6
    assert torch.bincount(data.test_y).tolist() == [8] * 6
    memory = load_dataset(dataclasses.replace(cfg, decode="memory"))
    assert torch.equal(data.test_x[:], memory.test_x) and torch.equal(data.train_x[:], memory.train_x)
    geo3k = load_dataset(dataclasses.replace(cfg, options={**cfg.options, "split_csv": files["geo3k"]}))
    assert geo3k.clients.unique().tolist() == list(range(16)) and torch.equal(geo3k.train_y, data.train_y)


def test_when_a_dataset_streams():
    assert wants_stream("stream", 1, 1) and not wants_stream("memory", 10**12, 224)
    assert wants_stream("auto", 10**12, 224) and not wants_stream("auto", 100, 32)
    assert wants_stream("auto", 100, 32, large=True)  # iNat-GEO streams whatever its size
    with pytest.raises(DataError, match="--decode must be one of"):
        DataConfig(decode="lazy")
    with pytest.raises(DataError, match="cifar10 is held in memory"):
        load_dataset(DataConfig("cifar10", root="/nowhere", decode="stream"))
