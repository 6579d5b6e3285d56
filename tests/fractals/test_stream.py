"""The batch stream: sizes, determinism and per-worker RNG streams."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fpsfl.base.images import AugmentConfig
from fractals.ifs import sample_codes
from fractals.scenes import SCENE_KINDS, RenderConfig
from fractals.stream import FractalStream, StreamConfig, shard_rows


@pytest.fixture(scope="module")
def bank():
    return sample_codes(2000, seed=2)


def _stream(bank, **kw):
    aug = kw.pop("augment", None)
    return FractalStream(bank, RenderConfig.preset(32), StreamConfig(**{"batch_size": 8, **kw}), aug)


def test_epoch_has_the_configured_pairs(bank):
    stream = _stream(bank, pairs_per_epoch=30)
    batches = list(stream)
    assert len(stream) == len(batches) == 4
    assert [b["images"].shape[1] for b in batches] == [8, 8, 8, 6]
    assert batches[0]["images"].shape == (2, 8, 32, 32, 3) and batches[0]["images"].dtype == torch.uint8


def test_same_seed_same_stream_and_epochs_differ(bank):
    a, b = list(_stream(bank, pairs_per_epoch=16)), list(_stream(bank, pairs_per_epoch=16))
    assert all(torch.equal(x["images"], y["images"]) for x, y in zip(a, b, strict=True))
    other = _stream(bank, pairs_per_epoch=16)
    other.set_epoch(1)
    assert not torch.equal(next(iter(other))["images"], a[0]["images"])
    reseeded = _stream(bank, pairs_per_epoch=16, seed=1)
    assert not torch.equal(next(iter(reseeded))["images"], a[0]["images"])


def test_workers_get_distinct_streams_and_the_epoch_is_worker_invariant(bank):
    stream = _stream(bank, pairs_per_epoch=32)
    alone = list(stream)
    loader = DataLoader(stream, batch_size=None, num_workers=2)
    parallel = list(loader)
    assert len(parallel) == len(alone) == 4
    # Worker 0 made batches 0 and 2, worker 1 made 1 and 3; no two batches repeat each other.
    codes = [b["codes"] for b in parallel]
    assert all(not torch.equal(codes[i], codes[j]) for i in range(4) for j in range(i + 1, 4))
    assert all(torch.equal(x["images"], y["images"]) for x, y in zip(alone, parallel, strict=True))


def test_batch_index_past_the_end(bank):
    with pytest.raises(IndexError):
        _stream(bank, pairs_per_epoch=16).batch(2)


@pytest.mark.parametrize("kind", list(SCENE_KINDS))
def test_every_kind_yields_renders_and_codes(bank, kind):
    batch = next(iter(_stream(bank, kind=kind, pairs_per_epoch=8, n_classes=50)))
    images, codes = batch["images"], batch["codes"]
    assert images.dtype == torch.uint8 and images.shape[1:] == (8, 32, 32, 3)
    assert 1 <= images.shape[0] <= SCENE_KINDS[kind].views
    assert codes.shape[0] == 8 and (codes >= 0).sum(1).min() >= 1
    assert all(images[v, i].max() > 0 for v in range(images.shape[0]) for i in range(8))


@pytest.mark.parametrize("kind", list(SCENE_KINDS))
def test_augmented_views(bank, kind):
    stream = _stream(bank, kind=kind, pairs_per_epoch=8, n_classes=50, augment=AugmentConfig())
    batch = next(iter(stream))
    views = SCENE_KINDS[kind].views
    assert batch["views"].shape == (views, 8, 3, 32, 32) and batch["views"].dtype == torch.float32
    assert torch.isfinite(batch["views"]).all()
    if kind == "single":  # two augmentations of the same image differ
        assert not torch.equal(batch["views"][0], batch["views"][1])
    if kind == "multilabel":
        assert batch["labels"].shape == (8, 50)
        assert torch.equal(batch["labels"].sum(1), (batch["codes"] >= 0).sum(1).float())


@pytest.mark.parametrize("kind", list(SCENE_KINDS))
@pytest.mark.parametrize("world", [2, 4])
def test_rank_shards_of_every_batch_are_the_whole_batch(bank, kind, world):
    """DDP's invariant: the processes' rows of each global batch (last, shorter one included), put together
    in rank order, are the single-process batch bit for bit: renders, codes, labels, augmented views."""
    for augment in (None, AugmentConfig()):
        kw = {"kind": kind, "pairs_per_epoch": 12, "n_classes": 50, "augment": augment}
        whole = _stream(bank, **kw)
        ranks = [FractalStream(whole.bank, whole.render, whole.cfg, augment, shard=(r, world)) for r in
                 range(world)]
        for index in range(len(whole)):  # batches of 8 and 4 pairs
            one = whole.batch(index)
            parts = [r.batch(index) for r in ranks]
            for key, value in one.items():
                dim = 1 if key in ("images", "views") else 0
                assert torch.equal(torch.cat([p[key] for p in parts], dim), value), (index, key)


def test_shard_rows_split_evenly_or_refuse():
    assert [shard_rows(8, r, 4) for r in range(4)] == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert shard_rows(8, 0, 1) == slice(0, 8)
    with pytest.raises(ValueError, match="evenly"):
        shard_rows(6, 0, 4)


def test_bad_stream_config():
    with pytest.raises(ValueError):
        StreamConfig(kind="mosaic")
    with pytest.raises(ValueError):
        StreamConfig(batch_size=0)


def test_codes_are_padded_with_minus_one(bank):
    cfg = StreamConfig(batch_size=16, pairs_per_epoch=16)
    stream = FractalStream(bank, RenderConfig.preset(224, points=400), cfg)
    batch = next(iter(stream))
    counts = (batch["codes"] >= 0).sum(1).numpy()
    assert counts.min() >= 2 and counts.max() <= 5
    assert np.all(batch["codes"].numpy()[batch["codes"].numpy() < 0] == -1)
