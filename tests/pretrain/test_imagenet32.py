"""pretrain supervised --format imagenet32: down-sampled ImageNet read from the ten pickled batches as
Chrabaszcz et al. 2017 publish them (channel-major rows, 1-based labels), batched like an image folder."""

import pickle

import numpy as np
import pytest
import torch

from pretrain.cli import main
from pretrain.folder import FolderConfig, FolderError
from pretrain.imagenet32 import TRAIN_FILES, ImageNet32Source, read_imagenet32
from recipes.smoke_data import write_imagenet32


def test_rows_become_channels_last_images_and_labels_0_based(tmp_path):
    written = write_imagenet32(tmp_path, per_batch=7, classes=5)
    images, labels = read_imagenet32(str(tmp_path))
    assert images.shape == (70, 32, 32, 3) and images.dtype == np.uint8 and labels.dtype == np.int64
    data = np.concatenate([written[name][0] for name in TRAIN_FILES])  # val_data is not pre-trained on
    for i in (0, 13, 69):  # R plane, then G, then B: pixel (r, c) of channel k is row[k 1024 + 32 r + c]
        for k in range(3):
            assert np.array_equal(images[i, :, :, k], data[i, k * 1024:(k + 1) * 1024].reshape(32, 32))
    assert labels.tolist() == [y - 1 for name in TRAIN_FILES for y in written[name][1]]


def test_source_batches_follow_the_folder_order_and_train(tmp_path, capsys):
    write_imagenet32(tmp_path / "in32", per_batch=8, classes=4)
    source = ImageNet32Source(FolderConfig(str(tmp_path / "in32"), 32, batch_size=16, labelled=True, seed=3))
    images, labels = read_imagenet32(str(tmp_path / "in32"))
    assert len(source) == 5 and source.classes == ["1", "2", "3", "4"]
    for batch, rows in zip(source.batches(2), source.order(2), strict=True):
        assert torch.equal(batch["images"][0], torch.from_numpy(images[rows]))
        assert torch.equal(batch["labels"], torch.from_numpy(labels[rows]))
    out = tmp_path / "in32.ckpt"
    code = main(["supervised", "--format", "imagenet32", "--root", str(tmp_path / "in32"), "--epochs", "1",
                 "--batch-size", "16", "--width", "0.25", "--device", "cpu", "--quiet", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    ckpt = torch.load(out, weights_only=True)
    assert ckpt["source"] == "supervised" and ckpt["config"]["n_classes"] == 4 and ckpt["epoch"] == 1


def test_missing_or_foreign_files_are_one_line(tmp_path, capsys):
    write_imagenet32(tmp_path, per_batch=4)
    (tmp_path / "train_data_batch_7").unlink()
    with pytest.raises(FolderError, match="lacks train_data_batch_7"):
        read_imagenet32(str(tmp_path))
    (tmp_path / "train_data_batch_7").write_bytes(pickle.dumps({"data": np.zeros((2, 10), np.uint8),
                                                                "labels": [1, 2]}))
    with pytest.raises(FolderError, match=r"\(N, 3 S\^2\) rows"):
        read_imagenet32(str(tmp_path))
    (tmp_path / "train_data_batch_7").write_bytes(pickle.dumps({"data": np.zeros((2, 3072), np.uint8),
                                                                "labels": [0, 2]}))
    with pytest.raises(FolderError, match="1-based"):
        read_imagenet32(str(tmp_path))
    code = main(["supervised", "--format", "imagenet32", "--root", str(tmp_path), "--size", "64", "--device",
                 "cpu", "--out", str(tmp_path / "x.ckpt")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pretrain: error:" in err


class _Payload:
    """Unpickling it calls ``os.system`` (issue 42: a batch file must not run code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_batch_that_would_run_code_is_refused_in_one_line(tmp_path, capsys):
    written = write_imagenet32(tmp_path, per_batch=3, classes=2)
    marker = tmp_path / "ran"
    real = (tmp_path / "train_data_batch_4").read_bytes()
    payload = {"data": written["train_data_batch_4"][0], "labels": [_Payload(marker)] * 3}
    (tmp_path / "train_data_batch_4").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(FolderError, match=r"train_data_batch_4'?: it holds (posix|os)\.system.*refusing"):
        read_imagenet32(str(tmp_path))
    code = main(["supervised", "--format", "imagenet32", "--root", str(tmp_path), "--device", "cpu", "--out",
                 str(tmp_path / "x.ckpt")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "system" in err and not marker.exists()
    (tmp_path / "train_data_batch_4").write_bytes(real)  # the published form still loads
    assert read_imagenet32(str(tmp_path))[0].shape == (30, 32, 32, 3)


def _batch(path, data, labels):
    path.write_bytes(pickle.dumps({"data": data, "labels": labels, "mean": np.zeros(3072)}, protocol=2))


def test_batches_are_taken_only_in_the_published_form(tmp_path):
    write_imagenet32(tmp_path, per_batch=2, classes=3)
    path, rows = tmp_path / "train_data_batch_2", np.full((2, 3072), 7, np.uint8)
    bad = {  # unchecked: a 200,000-way head, pixels wrapped modulo 256 (int16, then a list), ...
        r"1-based class ids \(1..1000\), found 1..200000": (rows, [1, 200000]),
        r"integers 0..255\), found 0..300": (rows.astype(np.int16) + np.int16([[293], [-7]]), [1, 2]),
        r"integers 0..255\), found 7..256": ((rows.astype(np.int64) + [[0], [249]]).tolist(), [1, 2]),
        r"found dtype float64": (rows.astype(np.float64), [1, 2]),
        r"'labels' must be a flat list .* \(2 rows\), got shape \(2, 1\)": (rows, [[1], [2]]),
        r"'labels' must be integer class ids, found dtype float64": (rows, [1.0, 2.5]),
        r"N >= 1, got shape \(0, 3072\)": (rows[:0], []),  # an empty batch
        r"N >= 1, got shape \(0,\)": ([], []),
    }
    for pattern, (data, labels) in bad.items():
        _batch(path, data, labels)
        with pytest.raises(FolderError, match=pattern) as e:
            read_imagenet32(str(tmp_path))
        assert "\n" not in str(e.value) and "train_data_batch_2" in str(e.value)
    _batch(path, rows.astype(np.int16), np.array([1000, 1], np.int32))  # integers 0..255 and ids 1..1000 do
    images, labels = read_imagenet32(str(tmp_path))
    assert images.dtype == np.uint8 and (images[2:4] == 7).all() and labels[2:4].tolist() == [999, 0]
