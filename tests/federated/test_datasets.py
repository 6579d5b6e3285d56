"""Dataset loaders on tiny data written in each real on-disk format; validation split; every DataError."""

import csv
import os
import pickle

import numpy as np
import pytest
import torch

from federated.datasets import (
    DATASETS,
    DataConfig,
    DataError,
    ImageData,
    Loaded,
    Preset,
    input_size_for,
    load_dataset,
    register_dataset,
    split_validation,
)
from recipes.smoke_data import (
    INAT_CLIENTS,
    TINY_WNIDS,
    identify,
    save,
    solid,
    write_cifar,
    write_cityscapes,
    write_imagefolder,
    write_inat,
    write_tiny,
)

# the writers of the real formats live in recipes/smoke_data.py, shared with the recipes' smoke runs
_write_cifar, _write_tiny, _write_inat = write_cifar, write_tiny, write_inat
_write_imagefolder = write_imagefolder
_identify = identify


def _save(path, k: int, fmt: str = "PNG", wh=(12, 9)) -> None:
    save(path, solid(k, wh), fmt)


# ---- one builder per registered dataset: a new dataset without one fails test_every_dataset_is_built -----


def _build_cifar10(tmp_path):
    _write_cifar(tmp_path, hundred=False)
    return DataConfig("cifar10", root=str(tmp_path))


def _build_cifar100(tmp_path):
    _write_cifar(tmp_path, hundred=True)
    return DataConfig("cifar100", root=str(tmp_path))


def _build_tiny(tmp_path):
    _write_tiny(tmp_path)
    return DataConfig("tinyimagenet", root=str(tmp_path), store_size=16)


def _build_inat(tmp_path):
    csv_path, _ = _write_inat(tmp_path)
    return DataConfig("inat-geo", root=str(tmp_path / "images"), options={"split_csv": csv_path},
                      store_size=8)


def _build_imagefolder(tmp_path):
    _write_imagefolder(tmp_path)
    return DataConfig("imagefolder", root=str(tmp_path), store_size=8)


def _build_cityscapes(tmp_path):
    from recipes.smoke_data import write_cityscapes

    write_cityscapes(tmp_path)
    return DataConfig("cityscapes", root=str(tmp_path), store_size=32)


BUILDERS = {"cifar10": _build_cifar10, "cifar100": _build_cifar100, "tinyimagenet": _build_tiny,
            "inat-geo": _build_inat, "imagefolder": _build_imagefolder, "digits": lambda _: DataConfig(),
            "cityscapes": _build_cityscapes}


def test_every_dataset_is_built():
    assert set(BUILDERS) == set(DATASETS)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_loads_with_consistent_shapes(name, tmp_path, skip_md5):
    cfg = DataConfig(**{**BUILDERS[name](tmp_path).__dict__, "val_fraction": 0.2})
    spec, data = DATASETS[name], load_dataset(cfg)
    assert isinstance(data, ImageData) and spec.description and "\n" not in spec.description
    s = cfg.store_size or spec.store_size
    seg = spec.task == "segmentation"  # (N, H, W) uint8 train-id maps, 255 ignored; H = s, W = 2 s
    assert data.task == spec.task
    assert data.input_size == (spec.input_size if seg else input_size_for(spec.input_size, s))
    for x, y in ((data.train_x, data.train_y), (data.val_x, data.val_y), (data.test_x, data.test_y)):
        assert x.dtype == torch.uint8 and x.shape[1:] == ((s, 2 * s, 3) if seg else (s, s, 3)) and len(x) > 0
        assert y.dtype == (torch.uint8 if seg else torch.int64) and y.shape == x.shape[:(3 if seg else 1)]
        labelled = y[y != 255] if seg else y
        assert 0 <= int(labelled.min()) and int(labelled.max()) < data.n_classes == len(data.classes)
    if data.clients is not None:
        assert data.clients.dtype == torch.int64 and data.clients.shape == (len(data.train_y),)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_declares_its_preset(name):
    preset = DATASETS[name].preset  # Table 9: no dataset falls back to another's recipe
    assert isinstance(preset, Preset) and preset.lr > 0 and preset.batch_size > 0
    assert preset.optimizer in {"sgd", "adam"} and isinstance(preset.algos, dict)


def test_a_dataset_is_one_file():
    """A reader with @register_dataset is all a new dataset needs: load_dataset, shapes and preset follow."""
    preset = Preset(0.05, 4, "adam", {"fedprox": {"mu": 0.1}})

    @register_dataset("toy", store_size=8, input_size=224, needs_root=False, description="random toy images",
                      preset=preset, hflip=False)
    def read_toy(cfg: DataConfig, stored: int) -> Loaded:
        g = torch.Generator().manual_seed(cfg.seed)

        def images(n: int) -> torch.Tensor:  # uint8 (n, stored, stored, 3)
            return torch.randint(0, 256, (n, stored, stored, 3), dtype=torch.uint8, generator=g)

        return Loaded(images(20), torch.arange(20) % 3, images(6), torch.arange(6) % 3, ["a", "b", "c"])

    try:
        assert read_toy.__name__ == "read_toy"  # the decorator returns the reader itself
        data = load_dataset(DataConfig(name="toy", val_fraction=0.1))
        assert data.train_x.shape == (18, 8, 8, 3) and data.train_x.dtype == torch.uint8
        assert data.val_x.shape == (2, 8, 8, 3) and data.test_x.shape == (6, 8, 8, 3)
        assert data.train_y.shape == (18,) and data.val_y.shape == (2,) and data.test_y.shape == (6,)
        assert data.n_classes == 3 and data.classes == ["a", "b", "c"] and data.clients is None
        assert data.input_size == 32 and data.hflip is False and data.task == "classification"  # 8 px <= 32
        assert load_dataset(DataConfig(name="toy", store_size=64)).input_size == 224
        spec = DATASETS["toy"]
        assert spec.preset == preset and spec.default_partition == "dirichlet"
        assert spec.default_arch == "resnet18"  # input_size 224 > 32 (§4.2)
    finally:
        DATASETS.unregister("toy")
    assert "toy" not in DATASETS


def test_input_size_rule():
    assert input_size_for(224, 64) == 224 and input_size_for(224, 32) == 32 and input_size_for(32, 32) == 32
    assert input_size_for(224, 16) == 32 and input_size_for(32, 64) == 32


# ---- CIFAR ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hundred", [False, True])
def test_cifar_reads_the_real_pickles(tmp_path, skip_md5, hundred):
    written = _write_cifar(tmp_path, hundred)
    name = "cifar100" if hundred else "cifar10"
    data = load_dataset(DataConfig(name, root=str(tmp_path), val_fraction=0))
    train_files = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    test_files = ["test"] if hundred else ["test_batch"]
    for files, x, y in ((train_files, data.train_x, data.train_y), (test_files, data.test_x, data.test_y)):
        chw = np.concatenate([written[f][0] for f in files]).reshape(-1, 3, 32, 32)
        assert torch.equal(x, torch.from_numpy(chw.transpose(0, 2, 3, 1).copy()))  # HWC, as fractal renders
        assert y.tolist() == [label for f in files for label in written[f][1]]
    n = 100 if hundred else 10
    assert data.n_classes == n and data.classes == [f"class{i}" for i in range(n)] and data.clients is None
    assert data.input_size == 32 and len(data.val_y) == 0


def test_cifar_store_size_resizes(tmp_path, skip_md5):
    _write_cifar(tmp_path, hundred=False)
    data = load_dataset(DataConfig("cifar10", root=str(tmp_path), store_size=16, val_fraction=0))
    assert data.train_x.shape == (100, 16, 16, 3) and data.input_size == 32


def test_cifar_missing_or_partial_files_suggest_download(tmp_path, skip_md5):
    with pytest.raises(DataError, match="--download") as e:
        load_dataset(DataConfig("cifar10", root=str(tmp_path)))
    assert str(tmp_path / "cifar-10-batches-py") in str(e.value)
    _write_cifar(tmp_path, hundred=False)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError, match="missing or corrupted.*--download"):
        load_dataset(DataConfig("cifar10", root=str(tmp_path)))


def test_cifar_md5_is_checked_without_the_test_patch(tmp_path):
    _write_cifar(tmp_path, hundred=True)  # the fake files cannot match the real md5 sums
    with pytest.raises(DataError, match="corrupted"):
        load_dataset(DataConfig("cifar100", root=str(tmp_path)))



class _Payload:
    """Unpickling it calls ``os.system`` (issue 42: a CIFAR file must not run code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("hostile", ["data_batch_2", "batches.meta"])
def test_cifar_pickles_that_would_run_code_are_refused(tmp_path, skip_md5, hostile):
    _write_cifar(tmp_path, hundred=False)
    marker, path = tmp_path / "ran", tmp_path / "cifar-10-batches-py" / hostile
    real = path.read_bytes()
    path.write_bytes(pickle.dumps({"data": np.zeros((20, 3072), np.uint8), "labels": [0] * 20,
                                   "label_names": [_Payload(marker)]}, protocol=2))
    with pytest.raises(DataError, match=rf"{hostile}'?: it holds (posix|os)\.system.*refusing") as e:
        load_dataset(DataConfig("cifar10", root=str(tmp_path), val_fraction=0))
    assert "\n" not in str(e.value) and not marker.exists()
    path.write_bytes(real)  # the published form still loads
    assert len(load_dataset(DataConfig("cifar10", root=str(tmp_path), val_fraction=0)).train_y) == 100


def test_cifar_batches_in_another_form_are_one_line(tmp_path, skip_md5):
    _write_cifar(tmp_path, hundred=True)
    path = tmp_path / "cifar-100-python" / "test"
    path.write_bytes(pickle.dumps({"data": np.zeros((3, 3072), np.int16), "fine_labels": [0, 1, 2]}))
    with pytest.raises(DataError, match=r"not a CIFAR batch: .*got int16 \(3, 3072\)"):
        load_dataset(DataConfig("cifar100", root=str(tmp_path)))
    path.write_bytes(pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0, 100]}))
    with pytest.raises(DataError, match=r"must lie in 0..99 \(one per class name\), found 0..100"):
        load_dataset(DataConfig("cifar100", root=str(tmp_path)))


# ---- Tiny-ImageNet ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("point_at", ["parent", "folder"])
def test_tinyimagenet_labels_follow_wnids(tmp_path, point_at):
    base, train_owner, test_owner = _write_tiny(tmp_path)
    root = base if point_at == "folder" else tmp_path
    data = load_dataset(DataConfig("tinyimagenet", root=str(root), val_fraction=0))
    assert data.classes == TINY_WNIDS and data.n_classes == 3
    assert data.train_x.shape == (9, 64, 64, 3) and data.input_size == 64  # Tables 1 and 8: 64^2
    assert data.train_y.tolist() == [train_owner[k] for k in _identify(data.train_x)]
    assert sorted(_identify(data.train_x)) == sorted(train_owner)
    assert _identify(data.test_x) == [20, 21, 22, 23]  # val_annotations.txt order
    assert data.test_y.tolist() == [test_owner[k] for k in _identify(data.test_x)]


def test_tinyimagenet_small_store_trains_at_32(tmp_path):
    _write_tiny(tmp_path)
    data = load_dataset(DataConfig("tinyimagenet", root=str(tmp_path), store_size=32))
    assert data.train_x.shape[1:] == (32, 32, 3) and data.input_size == 32


# ---- iNaturalist-GEO --------------------------------------------------------------------------------------


def _inat(tmp_path, csv_path, **kw):  # held in memory to identify images (streaming: test_stream.py)
    return load_dataset(DataConfig("inat-geo", root=str(tmp_path / "images"), options={"split_csv": csv_path},
                                   store_size=8, val_fraction=0, decode="memory", **kw))


def test_inat_geo_natural_clients_labels_and_holdout(tmp_path):
    csv_path, owner = _write_inat(tmp_path)
    data = _inat(tmp_path, csv_path)
    train_k, test_k = _identify(data.train_x), _identify(data.test_x)
    assert sorted(train_k + test_k) == sorted(owner)  # every image once
    ids = {"geo_a": 0, "geo_b": 1, "geo_c": 2}
    assert data.clients.tolist() == [ids[owner[k][0]] for k in train_k]
    assert data.train_y.tolist() == [owner[k][1] for k in train_k]  # the `class` column, not `label`
    assert data.test_y.tolist() == [owner[k][1] for k in test_k]
    held = [sum(owner[k][0] == c for k in test_k) for c in INAT_CLIENTS]
    assert held == [n // 10 for n in INAT_CLIENTS.values()]  # 10% of each client, rounded down
    assert data.n_classes == 4 and data.input_size == 32 and data.train_x.shape[1:] == (8, 8, 3)


def test_inat_geo_holdout_ignores_seed_and_row_order(tmp_path):
    csv_path, _ = _write_inat(tmp_path)
    test = sorted(_identify(_inat(tmp_path, csv_path).test_x))
    assert sorted(_identify(_inat(tmp_path, csv_path, seed=3).test_x)) == test
    (tmp_path / "split.csv").unlink()
    shuffled, _ = _write_inat(tmp_path, shuffle=1)
    assert sorted(_identify(_inat(tmp_path, shuffled).test_x)) == test


def test_inat_geo_paths_and_split_column(tmp_path):
    _, owner = _write_inat(tmp_path)
    rows = [[f" {c} ", rel, y, "test" if k % 5 == 0 else "Train"] for k, (c, y, rel) in owner.items()]
    with open(tmp_path / "paths.csv", "w", newline="") as f:
        csv.writer(f).writerows([["Client", "image_path", "label", "split"]] + rows)
    data = _inat(tmp_path, str(tmp_path / "paths.csv"))
    assert sorted(_identify(data.test_x)) == [k for k in sorted(owner) if k % 5 == 0]
    assert data.train_y.tolist() == [owner[k][1] for k in _identify(data.train_x)]


@pytest.mark.parametrize("escape", ["../outside.png", "ABSOLUTE"])
def test_inat_geo_refuses_image_paths_outside_the_data_root(tmp_path, escape):
    """A split CSV names images of the dataset: a path that leaves --data-root (issue 42) is one line, not
    a read of whatever file it points at, even when that file exists and is an image."""
    _, owner = _write_inat(tmp_path)
    outside = tmp_path / "outside.png"
    save(outside, solid(0, (12, 9)))
    value = str(outside) if escape == "ABSOLUTE" else escape
    rows = [[c, value if k == 0 else rel, y] for k, (c, y, rel) in owner.items()]
    with open(tmp_path / "escape.csv", "w", newline="") as f:
        csv.writer(f).writerows([["client", "image_path", "label"]] + rows)
    with pytest.raises(DataError, match="outside --data-root"):
        _inat(tmp_path, str(tmp_path / "escape.csv"))


# ---- imagefolder, digits, validation ----------------------------------------------------------------------


def test_imagefolder_train_and_test_classes(tmp_path):
    test_owner = _write_imagefolder(tmp_path, test_classes=("cat", "eel"))  # test lacks dog
    data = load_dataset(DataConfig("imagefolder", root=str(tmp_path), store_size=8, val_fraction=0))
    assert data.classes == ["cat", "dog", "eel"] and data.input_size == 32  # stored 8 px <= 32
    assert _identify(data.train_x) == list(range(6)) and data.train_y.tolist() == [0, 0, 1, 1, 2, 2]
    assert data.test_y.tolist() == [test_owner[k] for k in _identify(data.test_x)] == [0, 2]
    own = load_dataset(DataConfig("imagefolder", root=str(tmp_path)))  # 12 x 9 px images: kept at 9 px
    assert own.train_x.shape[1] == 9 and own.input_size == 32


def test_imagefolder_keeps_small_images_at_their_own_side_and_stores_large_ones_at_64_px(tmp_path):
    for part in ("train", "test"):
        for c in ("a", "b"):
            _save(tmp_path / "small" / part / c / "0.png", 1, wh=(32, 32))
            _save(tmp_path / "large" / part / c / "0.png", 1, wh=(100, 80))
    small = load_dataset(DataConfig("imagefolder", root=str(tmp_path / "small"), val_fraction=0))
    assert small.train_x.shape[1] == 32 and small.input_size == 32  # 32 px images train at 32 px
    large = load_dataset(DataConfig("imagefolder", root=str(tmp_path / "large"), val_fraction=0))
    assert large.train_x.shape[1] == 64 and large.input_size == 224  # the 224 px recipe (§4.5)


def test_one_odd_image_does_not_set_the_side_of_every_image(tmp_path, capsys):
    for part in ("train", "test"):
        for c in ("a", "b"):
            for i in (1, 2):
                _save(tmp_path / part / c / f"00{i}.png", i, wh=(32, 32))
    _save(tmp_path / "train" / "a" / "000.png", 0, wh=(1, 1))  # the first image of the walk
    data = load_dataset(DataConfig("imagefolder", root=str(tmp_path), val_fraction=0))
    assert data.train_x.shape[1:] == (32, 32, 3) and data.input_size == 32 and len(data.train_y) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 of 5 training images have a shorter side other than 32 px" in err
    load_dataset(DataConfig("imagefolder", root=str(tmp_path), val_fraction=0, store_size=16))
    assert capsys.readouterr().err == ""  # a side the user set: nothing to warn about


def test_one_odd_cityscapes_image_is_named_and_does_not_set_the_width(tmp_path):
    """The stored width is Cityscapes' 2:1, not the first file's: an odd FIRST image is the one refused."""
    from PIL import Image

    write_cityscapes(tmp_path)
    first = sorted((tmp_path / "leftImg8bit" / "train").rglob("*_leftImg8bit.png"))[0]
    Image.new("RGB", (64, 64)).save(first)
    label = str(first).replace("leftImg8bit", "gtFine", 1).replace("_leftImg8bit.png", "_gtFine_labelIds.png")
    Image.new("L", (64, 64)).save(label)
    refusal = rf"{first.name}' is 64x64 px .*2:1 \(2048x1024\), stored here at 64x32"
    with pytest.raises(DataError, match=refusal):
        load_dataset(DataConfig("cityscapes", root=str(tmp_path), store_size=32))


def test_digits_shape_range_and_fixed_test_set():
    a, b = load_dataset(DataConfig()), load_dataset(DataConfig(seed=7))
    assert a.train_x.shape[1:] == (32, 32, 3) and a.train_x.dtype == torch.uint8
    assert len(a.test_y) == 360 and len(a.train_y) + len(a.val_y) == 1437 and len(a.val_y) == 29
    assert int(a.train_x.max()) == 255 and int(a.train_x.min()) == 0
    assert torch.equal(a.train_x[..., 0], a.train_x[..., 2])  # grey
    assert torch.equal(a.test_x, b.test_x) and torch.equal(a.test_y, b.test_y)  # whatever the seed
    assert not torch.equal(a.val_y, b.val_y) or not torch.equal(a.val_x, b.val_x)
    assert torch.bincount(a.test_y).tolist() == torch.bincount(b.test_y).tolist()
    assert torch.bincount(a.test_y).min() >= 35  # stratified: ~36 per class
    c = load_dataset(DataConfig())
    assert torch.equal(a.train_x, c.train_x) and torch.equal(a.val_y, c.val_y)


def test_split_validation_partitions_deterministically():
    train, val = split_validation(1000, 0.02, seed=4)
    assert len(val) == 20 and len(train) == 980
    assert sorted(train.tolist() + val.tolist()) == list(range(1000))  # disjoint and complete
    assert train.tolist() == sorted(train.tolist()) and val.tolist() == sorted(val.tolist())
    again, other = split_validation(1000, 0.02, seed=4), split_validation(1000, 0.02, seed=5)
    assert torch.equal(val, again[1]) and not torch.equal(val, other[1])
    assert len(split_validation(10, 0.0, 0)[1]) == 0


def test_val_split_of_loaded_data_is_disjoint_from_train():
    full = load_dataset(DataConfig(val_fraction=0))
    data = load_dataset(DataConfig(val_fraction=0.1, seed=2))
    train, val = split_validation(len(full.train_y), 0.1, 2)
    assert torch.equal(data.val_x, full.train_x[val]) and torch.equal(data.train_x, full.train_x[train])
    assert torch.equal(data.val_y, full.train_y[val])


def test_to_moves_every_tensor():
    data = load_dataset(DataConfig()).to("meta")
    assert all(t.device.type == "meta" for t in (data.train_x, data.val_y, data.test_x))


# ---- every DataError is one line --------------------------------------------------------------------------


def _bad_csv(tmp_path):
    _write_inat(tmp_path, header=("user_id", "picture", "class", "label"))
    return DataConfig("inat-geo", root=str(tmp_path / "images"),
                      options={"split_csv": str(tmp_path / "split.csv")})


ERRORS = {
    "unknown dataset": (lambda p: DataConfig("mnist"), "unknown dataset 'mnist'; choose from cifar10"),
    "missing root": (lambda p: DataConfig("cifar10"), "needs --data-root"),
    "root does not exist": (lambda p: DataConfig("tinyimagenet", root=str(p / "nope")), "no wnids.txt"),
    "cifar files missing": (lambda p: DataConfig("cifar100", root=str(p)), "pass --download"),
    "bad csv header": (_bad_csv, "no image column.*accepted names"),
    "no split csv": (lambda p: DataConfig("inat-geo", root=str(p)), "--split-csv"),
    "no test folder": (lambda p: (p / "train" / "a").mkdir(parents=True) or
                       DataConfig("imagefolder", root=str(p)), "ROOT/test"),
    "val fraction": (lambda p: DataConfig(val_fraction=1.0), r"val_fraction must lie in \[0, 1\)"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_data_errors_are_one_line(case, tmp_path):
    build, pattern = ERRORS[case]
    with pytest.raises(DataError, match=pattern) as e:
        load_dataset(build(tmp_path))
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)
