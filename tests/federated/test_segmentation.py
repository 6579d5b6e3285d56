"""Segmentation task: joint image/label augmentation, per-sample loss with ignore pixels, DeepLabV3+."""

import math

import pytest
import torch

from federated.tasks.segmentation import IGNORE, SegmentationTask, resize_pair, scale_crop_flip
from pretrain.backbones import create_backbone


def _blocks(b=4, h=32, w=64):
    """Images whose grey value is 20 * class, labels = class, in 8x8 blocks of 5 classes; some ignore."""
    g = torch.Generator().manual_seed(0)
    coarse = torch.randint(0, 5, (b, h // 8, w // 8), generator=g)
    coarse[:, 0, 0] = IGNORE
    y = coarse.repeat_interleave(8, 1).repeat_interleave(8, 2).to(torch.uint8)
    x = torch.where(y == IGNORE, 250, y.long() * 20).to(torch.uint8)[..., None].expand(-1, -1, -1, 3)
    return x.contiguous(), y


def test_scale_crop_flip_keeps_image_and_label_aligned():
    x, y = _blocks()
    image, label = scale_crop_flip(x, y, 48, torch.Generator().manual_seed(3))
    assert image.shape == (4, 3, 48, 48) and label.shape == (4, 48, 48) and label.dtype == torch.int64
    inside = (label != IGNORE) & (image[:, 0] > 0)
    # away from block edges, bilinear image values equal 20 * label exactly; edges blend
    agree = (image[:, 0][inside] - 20 * label[inside].float()).abs() < 1
    assert agree.float().mean() > 0.7
    assert set(label.unique().tolist()) <= {0, 1, 2, 3, 4, IGNORE}


def test_outside_the_image_is_ignored_and_black():
    x, y = _blocks(b=8, h=16, w=16)
    y[:] = 1
    x[:] = 20
    image, label = scale_crop_flip(x, y, 64, torch.Generator().manual_seed(0))  # crop 64 > 2 x 16: overhangs
    outside = label == IGNORE
    assert outside.any() and (label[~outside] == 1).all()
    values = image[:, 0][outside]  # zero padding, blended with the image along the border
    assert (values <= 20 + 1e-4).all() and (values == 0).float().mean() > 0.8


def test_resize_pair_uses_nearest_for_labels():
    x, y = _blocks(b=2)
    image, label = resize_pair(x, y, (16, 32))
    assert image.shape == (2, 3, 16, 32) and label.shape == (2, 16, 32)
    assert set(label.unique().tolist()) <= set(y.unique().tolist())


def test_loss_is_a_per_sample_mean_over_labelled_pixels():
    task = SegmentationTask(3, 8, (4, 4))
    logits = torch.zeros(2, 3, 2, 2)  # uniform: every labelled pixel costs log 3
    target = torch.tensor([[[0, 1], [IGNORE, IGNORE]], [[2, 2], [2, IGNORE]]])
    assert torch.allclose(task.loss(logits, target), torch.full((2,), math.log(3)))
    all_ignored = torch.full((1, 2, 2), IGNORE)
    assert task.loss(logits[:1], all_ignored).item() == 0.0


def test_dominant_class_and_pixel_counts():
    task = SegmentationTask(4, 8, (4, 4))
    y = torch.tensor([[[1, 1], [2, IGNORE]], [[3, 3], [3, 0]]], dtype=torch.uint8)
    assert task.sample_labels(y).tolist() == [1, 3]
    assert task.class_counts(y).tolist() == [1, 2, 1, 3]


@pytest.mark.parametrize("init_seed", [0])
def test_deeplab_takes_the_backbone_weights(init_seed):
    torch.manual_seed(init_seed)
    backbone = create_backbone("mobilenet_v2")
    model = SegmentationTask(19, 64, (64, 128)).build_model(backbone)
    for key, value in backbone.state_dict().items():
        assert torch.equal(model.encoder.state_dict()[key], value)
    out = model.eval()(torch.zeros(1, 3, 64, 128))
    assert out.shape == (1, 19, 64, 128)
