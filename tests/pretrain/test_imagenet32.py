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
