"""Cityscapes (Table 5) on a miniature tree in the real layout: label ids -> train ids, cities as clients,
val as test, stored height; mIoU by hand; a federated and a centralised round through the CLI; an FPS
MobileNetV2 checkpoint in the DeepLabV3+ encoder; every user error as one line with exit 2."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from federated.cli import main
from federated.datasets import DATASETS, DataConfig, DataError, keep_rows, load_dataset
from federated.datasets.cityscapes import read_cityscapes
from federated.experiment import FederateConfig
from federated.setup import setup
from federated.tasks.segmentation import confusion, iou_from_confusion
from fpsfl.base.checkpoint import make_checkpoint, save_checkpoint
from pretrain.backbones import create_backbone
from recipes.smoke_data import CS_BLOCK, CS_H, CS_IDS, CS_VAL_CITY, CS_W, write_cityscapes

H, W, BLOCK = CS_H, CS_W, CS_BLOCK  # the miniature tree of recipes/smoke_data.py (shared with the recipes)
# real Cityscapes label ids -> train ids (Cordts et al. 2016; torchvision's Cityscapes.classes), written out
# by hand so that a wrong table fails: unlabeled, ego vehicle, out of roi, static -> ignored (255)
TRAIN_ID = {0: 255, 1: 255, 3: 255, 4: 255, 7: 0, 8: 1, 11: 2, 24: 11, 26: 13}
assert tuple(TRAIN_ID) == CS_IDS  # the writer's label ids are the ones this table maps
CS_NAMES = ["road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
            "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle",
            "bicycle"]
CLI = ["--dataset", "cityscapes", "--rounds", "1", "--local-epochs", "1", "--crop-size", "64",
       "--eval-size", "64x128", "--device", "cpu", "--quiet", "--val-fraction", "0", "--min-size", "2"]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "cityscapes"
    return root, write_cityscapes(root)


def _train_ids(ids: np.ndarray) -> np.ndarray:
    out = np.full(ids.shape, -1)
    for label_id, train_id in TRAIN_ID.items():
        out[ids == label_id] = train_id
    return out


def _cli(args, capsys):
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


# ---- the loader -------------------------------------------------------------------------------------------


def test_label_ids_become_train_ids_and_cities_become_clients(tree):
    root, written = tree
    data = load_dataset(DataConfig("cityscapes", root=str(root), store_size=H, val_fraction=0))
    assert data.task == "segmentation" and data.n_classes == 19 and data.classes == CS_NAMES
    assert data.input_size == 768 and data.hflip
    assert data.train_x.shape == (6, H, W, 3) and data.train_y.shape == (6, H, W)
    assert data.train_x.dtype == data.train_y.dtype == torch.uint8
    for (_, image, ids), x, y in zip(written["train"], data.train_x, data.train_y, strict=True):
        assert torch.equal(x, torch.from_numpy(image))  # the stored height is the source's: no resize
        assert (y.numpy() == _train_ids(ids)).all()
    assert (data.train_y == 255).any() and {0, 1, 2, 11, 13} <= set(data.train_y.unique().tolist())
    assert data.clients.dtype == torch.int64
    assert data.clients.tolist() == [0, 0, 1, 1, 2, 2]  # aachen, bremen, zurich
    assert [c for c, _, _ in written["train"]] == ["aachen"] * 2 + ["bremen"] * 2 + ["zurich"] * 2
    # the test set is the official val split
    assert data.test_x.shape == (2, H, W, 3)
    for (city, image, ids), x, y in zip(written["val"], data.test_x, data.test_y, strict=True):
        assert city == CS_VAL_CITY and torch.equal(x, torch.from_numpy(image))
        assert (y.numpy() == _train_ids(ids)).all()


def test_store_size_is_the_height_and_labels_are_resized_nearest(tree):
    root, _ = tree
    full = read_cityscapes(str(root), H)
    half = read_cityscapes(str(root), 32)
    assert half.train_x.shape == (6, 32, 64, 3) and half.train_y.shape == (6, 32, 64)
    assert half.test_x.shape == (2, 32, 64, 3) and half.test_y.shape == (2, 32, 64)
    valid = set(range(19)) | {255}
    assert set(half.train_y.unique().tolist()) <= valid and set(half.test_y.unique().tolist()) <= valid
    # nearest at /2 samples the pixel right of and below each 2 x 2 cell's centre: no blended ids
    assert torch.equal(half.train_y, full.train_y[:, 1::2, 1::2])
    # bilinear (antialiased) keeps the mean colour of the random images
    assert abs(half.train_x.float().mean() - full.train_x.float().mean()) < 1


def test_validation_split_keeps_images_labels_and_clients_aligned(tree):
    root, _ = tree
    full = load_dataset(DataConfig("cityscapes", root=str(root), store_size=H, val_fraction=0))
    data = load_dataset(DataConfig("cityscapes", root=str(root), store_size=H, val_fraction=0.34, seed=3))
    assert len(data.val_y) == 2 and data.val_y.shape == (2, H, W) and len(data.train_y) == 4
    rows = {bytes(x.numpy()): i for i, x in enumerate(full.train_x)}
    for x, y in ((data.train_x, data.train_y), (data.val_x, data.val_y)):
        for xi, yi in zip(x, y, strict=True):
            assert torch.equal(yi, full.train_y[rows[bytes(xi.numpy())]])
    kept = [rows[bytes(x.numpy())] for x in data.train_x]
    assert data.clients.tolist() == full.clients[kept].tolist()


def test_keep_rows_equals_indexing():
    x = torch.randint(0, 256, (50, 3, 4), dtype=torch.uint8)
    for keep in (torch.arange(50), torch.tensor([1, 2, 7, 8, 49]), torch.tensor([0]), torch.arange(0)):
        assert torch.equal(keep_rows(x.clone(), keep), x[keep])


def test_the_spec_is_the_papers():
    spec = DATASETS["cityscapes"]
    assert spec.needs_root and spec.task == "segmentation" and spec.default_partition == "natural"
    assert spec.default_arch == "mobilenet_v2" and spec.store_size == 1024 and spec.input_size == 768
    assert "leftImg8bit/{train,val}/<city>" in spec.description and "_gtFine_labelIds.png" in spec.description


# ---- mIoU -------------------------------------------------------------------------------------------------


def test_miou_against_a_hand_computed_confusion():
    target = torch.tensor([[0, 0, 1, 255], [1, 2, 2, 255]])
    pred = torch.tensor([[0, 1, 1, 0], [1, 2, 0, 2]])  # predictions on ignored pixels do not count
    conf = confusion(pred, target, 4)
    assert conf.tolist() == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    iou, miou, pixel_acc = iou_from_confusion(conf)
    assert iou[:3].tolist() == pytest.approx([1 / 3, 2 / 3, 1 / 2])
    assert math.isnan(iou[3])  # class 3: in neither prediction nor ground truth
    assert miou == pytest.approx(0.5)  # (1/3 + 2/3 + 1/2) / 3, not / 4 (= 0.375)
    assert pixel_acc == pytest.approx(4 / 6)


# ---- federated runs through the CLI -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fedavg", "centralized"])
def test_a_round_through_the_cli(tree, tmp_path, capsys, mode):
    root, _ = tree
    out = tmp_path / "run"
    extra = ["--centralized"] if mode == "centralized" else []
    code, err = _cli(["--data-root", root, "--out", out, *CLI, *extra], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert 0 <= row["test_miou"] <= 1 and 0 <= row["test_pixel_acc"] <= 1
    assert row["test_acc"] == row["test_miou"] and len(row["test_iou"]) == 19
    assert math.isfinite(row["train_loss"]) and (out / "final.pt").is_file()
    config = json.loads((out / "config.json").read_text())
    assert "mobilenet_v2" in json.dumps(config) and "natural" in json.dumps(config)
    if mode == "fedavg":
        assert row["clients"] == [0, 1, 2] and row["client_sizes"] == [2, 2, 2]


def test_an_fps_mobilenet_checkpoint_fills_the_deeplab_encoder(tree, tmp_path):
    root, _ = tree
    torch.manual_seed(7)
    net = create_backbone("mobilenet_v2")
    path = tmp_path / "fps.ckpt"
    save_checkpoint(make_checkpoint(net, arch="mobilenet_v2", width=1.0, method="simsiam", source="fps",
                                    epoch=1, config={}), path)
    cfg = FederateConfig(dataset="cityscapes", data_root=str(root), store_size=H, val_fraction=0,
                         partition="natural", min_size=2, arch="mobilenet_v2", init=str(path), crop_size=64,
                         eval_size="64x128")
    s = setup(cfg, torch.device("cpu"))
    encoder, saved = s.model.encoder.state_dict(), torch.load(path, weights_only=True)["backbone"]
    assert set(encoder) == set(saved)
    for key, value in saved.items():
        assert torch.equal(encoder[key], value), key
    n = len(saved)
    assert f"{n}/{n} backbone tensors loaded" in s.init_report


# ---- errors: one line, exit 2 -----------------------------------------------------------------------------


def _one_line_error(args, capsys) -> str:
    code, err = _cli(args, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("federate: error:"), err
    return err


def test_a_root_without_gtfine_names_it(tree, tmp_path, capsys):
    root, _ = tree
    shutil.rmtree(root / "gtFine")
    err = _one_line_error(["--data-root", root, "--out", tmp_path / "r", *CLI], capsys)
    assert "gtFine/" in err and "leftImg8bit/{train,val}/<city>" in err


def test_a_missing_split_folder_is_named(tree):
    root, _ = tree
    shutil.rmtree(root / "gtFine" / "val")
    with pytest.raises(DataError, match="gtFine/val/"):
        read_cityscapes(str(root), 32)


def test_a_label_of_another_size_is_named(tree, tmp_path, capsys):
    root, _ = tree
    bad = root / "gtFine" / "train" / "bremen" / "bremen_000001_000022_gtFine_labelIds.png"
    Image.fromarray(np.zeros((H // 2, W // 2), dtype=np.uint8)).save(bad)
    err = _one_line_error(["--data-root", root, "--out", tmp_path / "r", *CLI], capsys)
    assert bad.name in err and "64x32" in err


def test_a_missing_label_is_named(tree):
    root, _ = tree
    bad = root / "gtFine" / "val" / CS_VAL_CITY / f"{CS_VAL_CITY}_000000_000019_gtFine_labelIds.png"
    bad.unlink()
    with pytest.raises(DataError, match=bad.name):
        read_cityscapes(str(root), 32)


def test_moon_is_refused_for_segmentation(tree, tmp_path, capsys):
    root, _ = tree
    err = _one_line_error(["--data-root", root, "--out", tmp_path / "r", *CLI, "--algo", "moon"], capsys)
    assert "moon" in err


def test_a_resnet20_checkpoint_is_refused(tree, tmp_path, capsys):
    root, _ = tree
    path = tmp_path / "r20.ckpt"
    save_checkpoint(make_checkpoint(create_backbone("resnet20"), arch="resnet20", width=1.0, method="simsiam",
                                    source="fps", epoch=1, config={}), path)
    err = _one_line_error(["--data-root", root, "--out", tmp_path / "r", *CLI, "--init", path], capsys)
    assert "resnet20" in err and "mobilenet_v2" in err
