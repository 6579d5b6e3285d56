"""Fine-tuning batch transforms: shapes, pad-and-crop and flip from their definitions, resize, noise units."""

import numpy as np
import pytest
import torch

from federated.tasks.transforms import TrainAugment, add_noise, augment_batch, pad_crop, uses_pad_crop
from fpsfl.base.images import IMAGENET_MEAN, IMAGENET_STD, eval_batch

MEAN = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


def _images(b=6, s=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8, generator=g)


def _normalised(x):
    """The definition: uint8 (B, S, S, 3) -> (x / 255 - mean) / std as (B, 3, S, S)."""
    return (x.permute(0, 3, 1, 2).float() / 255 - MEAN) / STD


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(("stored", "size"), [(32, 32), (64, 224), (64, 32), (16, 32), (224, 224)])
def test_shapes_and_dtype(stored, size):
    out = augment_batch(_images(s=stored), TrainAugment(size), _gen())
    assert out.shape == (6, 3, size, size) and out.dtype == torch.float32 and torch.isfinite(out).all()
    ev = eval_batch(_images(s=stored), size)
    assert ev.shape == (6, 3, size, size) and ev.dtype == torch.float32


def test_mode_rule():
    assert uses_pad_crop(32, 32) and uses_pad_crop(16, 16)
    assert not uses_pad_crop(64, 224) and not uses_pad_crop(64, 64) and not uses_pad_crop(16, 32)


def test_pad_crop_from_its_definition():
    x, pad = _images(b=4, s=8), 3
    padded = np.zeros((4, 8 + 2 * pad, 8 + 2 * pad, 3), np.uint8)
    padded[:, pad:pad + 8, pad:pad + 8] = x.numpy()
    offsets = torch.tensor([[pad, pad], [0, 0], [6, 1], [2, 5]])  # (x0, y0) in the padded image
    flip = torch.tensor([False, False, True, False])
    out = pad_crop(x, pad, offsets, flip).numpy()
    assert np.array_equal(out[0], x[0].numpy())  # centred offset: the original
    for b in range(1, 4):
        x0, y0 = offsets[b].tolist()
        want = padded[b, y0:y0 + 8, x0:x0 + 8]
        assert np.array_equal(out[b], want[:, ::-1] if flip[b] else want), b
    assert (out[1, :pad] == 0).all() and (out[1, :, :pad] == 0).all()  # the zero border shows


def test_flip_flips():
    x = _images()
    flipped = pad_crop(x, 4, torch.full((6, 2), 4), torch.ones(6, dtype=torch.bool))
    assert torch.equal(flipped, x.flip(2))
    always = augment_batch(x, TrainAugment(32, pad=0, flip_p=1.0), _gen())
    assert torch.allclose(always, _normalised(x).flip(3), atol=1e-6)
    never = augment_batch(x, TrainAugment(32, pad=0, flip_p=0.0), _gen())
    assert torch.allclose(never, _normalised(x), atol=1e-6)


def test_resized_crop_of_the_whole_image_is_the_image_or_its_mirror():
    x = _images(s=48)
    whole = TrainAugment(48, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0))
    plain = augment_batch(x, TrainAugment(**{**whole.__dict__, "flip_p": 0.0}), _gen())
    mirror = augment_batch(x, TrainAugment(**{**whole.__dict__, "flip_p": 1.0}), _gen())
    assert torch.allclose(plain, _normalised(x), atol=1e-4)
    assert torch.allclose(mirror, _normalised(x).flip(3), atol=1e-4)


def test_pad_crop_draws_every_offset_and_both_flips():
    x = torch.zeros((400, 32, 32, 3), dtype=torch.uint8)
    x[:, 16, 16] = 255  # one white pixel: where it lands gives the offset and flip
    out = augment_batch(x, TrainAugment(32), _gen(1))
    hits = (out[:, 0] > 0).nonzero()[:, 1:]  # (B, 2) as (row, col)
    assert len(hits) == 400
    rows, cols = set(hits[:, 0].tolist()), set(hits[:, 1].tolist())
    assert rows == set(range(14, 19))  # 16 + 2 - y0 for y0 in 0..4 (Appendix B.1: 2 px padding)
    assert cols == set(range(13, 19))  # 16 + 2 - x0 unflipped, 31 - that flipped: 13..18


def test_eval_batch_resizes_and_normalises():
    x = _images(b=3, s=64)
    assert eval_batch(x, 224).shape == (3, 3, 224, 224)
    assert torch.allclose(eval_batch(x, 64), _normalised(x), atol=1e-6)
    grey = torch.full((2, 64, 64, 3), 77, dtype=torch.uint8)
    for size in (224, 32):  # a constant image stays constant whether enlarged or shrunk (antialiased)
        want = _normalised(grey)[:, :, :1, :1].expand(2, 3, size, size)
        assert torch.allclose(eval_batch(grey, size), want, atol=1e-5)
    stripes = torch.zeros((1, 64, 64, 3), dtype=torch.uint8)
    stripes[:, :, ::4] = 255  # every 4th column white: a plain bilinear / 4 samples columns 1-2 (black) only
    quarter = (eval_batch(stripes, 16) * STD + MEAN)[..., 1:-1]  # away from the border
    assert torch.allclose(quarter, torch.full_like(quarter, 0.25), atol=1e-3)  # antialiased: the mean


def test_noise_has_the_requested_std_in_pixel_units():
    x = eval_batch(torch.full((64, 32, 32, 3), 128, dtype=torch.uint8), 32)
    noisy = add_noise(x, 0.1, _gen(3))
    pixel_noise = (noisy - x) * STD  # back to [0, 1] units, per channel
    assert torch.allclose(pixel_noise.std((0, 2, 3)), torch.full((3,), 0.1), rtol=0.02)
    assert abs(float(pixel_noise.mean())) < 2e-3
    # the definition: the normalised image of (pixel + e), e ~ N(0, sigma^2) from the same generator
    e = torch.randn(x.shape, generator=_gen(3)) * 0.1
    assert torch.allclose(noisy, ((x * STD + MEAN) + e - MEAN) / STD, atol=1e-5)
    assert torch.equal(add_noise(x, 0.0, _gen()), x)


def test_same_seed_same_output():
    for stored, size in ((32, 32), (64, 96)):
        x, aug = _images(s=stored), TrainAugment(size)
        a, b = augment_batch(x, aug, _gen(5)), augment_batch(x, aug, _gen(5))
        assert torch.equal(a, b) and not torch.equal(a, augment_batch(x, aug, _gen(6)))
    x = eval_batch(_images(), 32)
    assert torch.equal(add_noise(x, 0.2, _gen(1)), add_noise(x, 0.2, _gen(1)))


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="uint8"):
        augment_batch(_images().float(), TrainAugment(32), _gen())
    with pytest.raises(ValueError, match="uint8"):
        eval_batch(_images().permute(0, 3, 1, 2), 32)
    for bad in ({"input_size": 0}, {"input_size": 32, "pad": -1}, {"input_size": 32, "flip_p": 2.0},
                {"input_size": 32, "crop_scale": (0.5, 0.2)}, {"input_size": 32, "std": (0.2, 0.0, 0.2)}):
        with pytest.raises(ValueError, match="TrainAugment"):
            TrainAugment(**bad)
