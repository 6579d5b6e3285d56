"""bench/crop_knn.py (issue 38's crop diagnostic): its kNN is the fair probe's, crops of the whole image
change nothing, and a random init's crops lie between the same image and another."""

import pytest
import torch

from pretrain.backbones import create_backbone
from pretrain.probe import probe
from tests.analysis.bench_scripts import bench_script


@pytest.fixture(scope="module")
def cropper():
    return bench_script("crop_knn")


def test_knn_is_the_fair_probes_and_crops_sit_between(cropper, small_digits):
    torch.manual_seed(0)
    backbone = create_backbone("resnet20", width=0.5)
    out = cropper.knn_crop(backbone, small_digits, 16, scales=(0.2,), n_crops=2)
    assert out["knn"] == round(100 * probe(backbone, small_digits, 16, linear=False)["knn_acc"], 2)
    assert 0 < out["crop_inv_0.2"] < 0.9  # two crops of a digit: nearer than another digit, not one point
    assert 0 < out["knn_crop_0.2"] <= 100


def test_a_crop_of_the_whole_image_is_the_image(cropper, small_digits):
    images = small_digits.train_x[:50]
    assert torch.equal(cropper.crops(images, 1.0, torch.Generator().manual_seed(0)), images)
    torch.manual_seed(0)
    out = cropper.knn_crop(create_backbone("resnet20", width=0.5), small_digits, 16, scales=(1.0,), n_crops=3)
    assert out["crop_inv_1"] == pytest.approx(1, abs=1e-4)
    assert out["knn_crop_1"] == out["knn"]


def test_crops_change_the_image_and_keep_its_type(cropper, small_digits):
    images = small_digits.train_x[:50]
    out = cropper.crops(images, 0.2, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert not torch.equal(out, images)


def test_invariance_measures_against_other_images(cropper):
    rows = torch.randn(64, 8)
    assert cropper.crop_invariance(rows, rows) == pytest.approx(1)
    assert abs(cropper.crop_invariance(rows, torch.randn(64, 8))) < 0.5
