"""Batched MoCo-v2 augmentations (fractals/augment.py) against torchvision's per-image functions and
against invariants of the full pipeline."""

import colorsys
import dataclasses

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import RandomResizedCrop

from fpsfl.base.images import (
    AugmentConfig,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    augment,
    blur_kernel_size,
    crop_theta,
    gaussian_blur,
    hsv_to_rgb,
    resized_crop,
    rgb_to_hsv,
    sample_crop_boxes,
    to_grayscale,
)

# Every probability off and the crop the whole (square) image: augment() must reduce to normalisation.
IDENTITY = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter_p=0.0, grayscale_p=0.0,
                         blur_p=0.0, flip_p=0.0)
RAW = dataclasses.replace(IDENTITY, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # no normalisation either


def _rand(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _images(b: int = 6, h: int = 12, w: int = 10, seed: int = 0) -> torch.Tensor:
    """A float batch (b >= 4) with the awkward cases: a grey image, black and white pixels, max ties, few
    levels."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, 3, h, w, generator=g)
    x[0] = x[0, :1]  # grey: zero chroma, undefined hue
    x[1, :, :2], x[1, :, 2:4] = 0.0, 1.0  # black and white rows
    x[2, 1] = x[2, 0]  # red == green everywhere: ties for the max
    x[3] = torch.randint(0, 4, (3, h, w), generator=g) / 3  # four levels: many ties of every kind
    return x


def _u8(b: int, size: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, size, size, 3), dtype=torch.uint8, generator=g)


# --- colour ops: per sample, against torchvision's per-image function ---------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs", "factors", "atol"),
    [
        (adjust_brightness, TF.adjust_brightness, (0.6, 1.0, 1.4, 0.0, 2.5, 0.9), 1e-6),
        (adjust_contrast, TF.adjust_contrast, (0.6, 1.0, 1.4, 0.0, 2.5, 0.9), 1e-6),
        (adjust_saturation, TF.adjust_saturation, (0.6, 1.0, 1.4, 0.0, 2.5, 0.9), 1e-6),
        # Hue divides by chroma and multiplies back: errors reach ~1.5e-6, a few float32 ulps of k < 16.
        (adjust_hue, TF.adjust_hue, (-0.5, -0.1, 0.0, 0.05, 0.1, 0.5), 5e-6),
    ],
)
def test_colour_op_matches_torchvision(ours, theirs, factors, atol):
    x = _images()
    before = x.clone()
    out = ours(x, torch.tensor(factors))
    ref = torch.stack([theirs(img, f) for img, f in zip(x, factors, strict=True)])
    torch.testing.assert_close(out, ref, atol=atol, rtol=0)
    assert torch.equal(x, before), "the pure wrapper must not modify its input"


def test_hue_shift_by_a_full_turn_is_identity():
    x = _images()
    once = adjust_hue(adjust_hue(x, torch.full((6,), 0.5)), torch.full((6,), 0.5))
    torch.testing.assert_close(once, x, atol=2e-6, rtol=0)


def test_rgb_to_hsv_matches_colorsys_and_round_trips():
    x = _images(b=4, h=5, w=5)
    hsv = rgb_to_hsv(x)
    assert hsv.min() >= 0 and hsv[:, 0].max() < 1 and hsv[:, 1:].max() <= 1
    pixels = x.permute(0, 2, 3, 1).reshape(-1, 3).tolist()
    ref = torch.tensor([colorsys.rgb_to_hsv(*p) for p in pixels])
    torch.testing.assert_close(hsv.permute(0, 2, 3, 1).reshape(-1, 3), ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(hsv_to_rgb(hsv), x, atol=1e-6, rtol=0)


def test_grayscale_matches_torchvision():
    x = _images()
    out = to_grayscale(x)
    torch.testing.assert_close(out, TF.rgb_to_grayscale(x, num_output_channels=3), atol=1e-6, rtol=0)
    assert torch.equal(out[:, 0], out[:, 2])


# --- blur -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [3, 5, 7])
def test_blur_matches_torchvision(kernel):
    x = _images()
    sigma = (0.1, 0.5, 1.0, 2.0, 3.0, 0.7)
    out = gaussian_blur(x, torch.tensor(sigma), kernel)
    ref = torch.stack([TF.gaussian_blur(img, [kernel] * 2, [s, s]) for img, s in zip(x, sigma, strict=True)])
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


def test_blur_with_zero_sigma_is_exact_identity():
    x = _images()
    assert torch.equal(gaussian_blur(x, torch.zeros(6), 5), x)


def test_blur_kernel_size_is_nearest_odd_tenth():
    # 5 px at 32 px as the FPS code's GaussianBlur(5); the nearest odd tenth of the side above
    assert [blur_kernel_size(s) for s in (8, 32, 64, 96, 224)] == [5, 5, 7, 9, 23]


# --- crop -----------------------------------------------------------------------------------------------


def test_resized_crop_of_output_sized_box_is_the_crop():
    x = _rand(4, 16, 12)
    boxes = torch.tensor([[0, 0, 8, 8], [4, 8, 8, 8], [2, 3, 8, 8], [4, 8, 8, 8]], dtype=torch.float32)
    flip = torch.tensor([False, False, True, True])
    out = resized_crop(x, boxes, 8, flip)
    for i, (x0, y0, w, h) in enumerate(boxes.int().tolist()):
        ref = x[i, :, y0 : y0 + h, x0 : x0 + w]
        torch.testing.assert_close(out[i], ref.flip(-1) if flip[i] else ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("box", [(1, 2, 7, 5), (0, 0, 12, 16), (3, 1, 9, 14), (5, 6, 3, 2), (11, 15, 1, 1)])
@pytest.mark.parametrize("flip", [False, True])
def test_resized_crop_matches_torchvision(box, flip):
    x = _rand(1, 16, 12)
    x0, y0, w, h = box
    out = resized_crop(x, torch.tensor([box], dtype=torch.float32), 10, torch.tensor([flip]))
    ref = TF.resized_crop(x[0], top=y0, left=x0, height=h, width=w, size=[10, 10], antialias=False)
    # Sample coordinates differ from torchvision's by float32 rounding (~1e-6 px), hence 2e-6.
    torch.testing.assert_close(out[0], ref.flip(-1) if flip else ref, atol=2e-6, rtol=0)


def test_resized_crop_grid_is_the_affine_grid_of_crop_theta():
    # Boxes at least as large as the output, so the clamp to the box is inactive.
    x = _rand(3, 16, 12)
    boxes = torch.tensor([[0, 0, 12, 16], [2, 3, 9, 10], [1, 0, 8, 8]], dtype=torch.float32)
    flip = torch.tensor([True, False, True])
    grid = F.affine_grid(crop_theta(boxes, 16, 12, flip), [3, 3, 8, 8], align_corners=False)
    ref = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    torch.testing.assert_close(resized_crop(x, boxes, 8, flip), ref, atol=1e-6, rtol=0)


def test_crop_boxes_follow_random_resized_crop():
    h, w, scale, ratio = 32, 40, (0.2, 1.0), (3 / 4, 4 / 3)
    boxes = sample_crop_boxes(4000, h, w, scale, ratio, torch.Generator().manual_seed(0), "cpu")
    assert boxes.shape == (4000, 4) and boxes.dtype == torch.float32 and torch.equal(boxes, boxes.round())
    x0, y0, bw, bh = boxes.T
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x0 + bw <= w).all() and (y0 + bh <= h).all()
    assert (bw >= 1).all() and (bh >= 1).all()
    # Sides are rounded, so area and aspect hold up to half a pixel per side.
    assert (bw * bh >= scale[0] * h * w - 0.5 * (bw + bh) - 0.25).all()
    assert ((bw + 0.5) / (bh - 0.5) >= ratio[0]).all() and ((bw - 0.5) / (bh + 0.5) <= ratio[1]).all()
    # Offsets reach both edges, and areas spread over the range (U(0.2, 1) truncated by the fit test).
    assert ((x0 == 0) & (bw < w)).any() and ((x0 + bw == w) & (bw < w)).any()
    assert ((y0 == 0) & (bh < h)).any() and ((y0 + bh == h) & (bh < h)).any()
    frac = bw * bh / (h * w)
    assert frac.min() < 0.25 and frac.max() > 0.95 and 0.45 < frac.median() < 0.65


def test_crop_boxes_fall_back_to_torchvision_central_crop():
    # Aspect (2, 3) cannot fit in a square image at full area: every attempt fails.
    boxes = sample_crop_boxes(5, 32, 32, (1.0, 1.0), (2.0, 3.0), torch.Generator().manual_seed(0), "cpu")
    i, j, h, w = RandomResizedCrop.get_params(torch.zeros(3, 32, 32), [1.0, 1.0], [2.0, 3.0])
    assert torch.equal(boxes, torch.tensor([[j, i, w, h]] * 5, dtype=torch.float32))


# --- the pipeline ---------------------------------------------------------------------------------------


def test_augment_shape_dtype_and_determinism():
    images = _u8(8, 16)
    before = images.clone()
    cfg = AugmentConfig()
    a = augment(images, cfg, torch.Generator().manual_seed(1))
    b = augment(images, cfg, torch.Generator().manual_seed(1))
    c = augment(images, cfg, torch.Generator().manual_seed(2))
    assert a.shape == (8, 3, 16, 16) and a.dtype == torch.float32 and torch.isfinite(a).all()
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert torch.equal(images, before)
    assert augment(images, cfg, torch.Generator().manual_seed(1), out_size=24).shape == (8, 3, 24, 24)


@pytest.mark.parametrize("world", [2, 4])
def test_augment_rows_of_a_batch_equal_the_whole_batch(world):
    """DDP's invariant: processes that each augment their rows (drawing the whole batch's randomness) give,
    together, the whole batch augmented at once, bit for bit, and leave their generators in its state."""
    images, cfg = _u8(16, 16, seed=3), AugmentConfig()
    whole_gen = torch.Generator().manual_seed(7)
    whole = torch.cat([augment(images, cfg, whole_gen) for _ in range(2)])  # two batches from one stream
    parts = []
    for rank in range(world):
        gen, rows = torch.Generator().manual_seed(7), slice(rank * 16 // world, (rank + 1) * 16 // world)
        parts.append([augment(images[rows], cfg, gen, rows=(rows.start, 16)) for _ in range(2)])
        assert torch.equal(gen.get_state(), whole_gen.get_state())
    joined = torch.cat([torch.cat([p[i] for p in parts]) for i in range(2)])
    assert torch.equal(joined, whole)
    with pytest.raises(ValueError, match="rows"):
        augment(images[:8], cfg, torch.Generator(), rows=(12, 16))


def test_augment_accepts_both_layouts():
    images = _u8(8, 16)
    floats = images.permute(0, 3, 1, 2).float() / 255
    cfg = AugmentConfig()
    a = augment(images, cfg, torch.Generator().manual_seed(3))
    b = augment(floats, cfg, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_augment_with_everything_off_only_normalises():
    images = _u8(8, 16)
    out = augment(images, IDENTITY, torch.Generator().manual_seed(0))
    x = images.permute(0, 3, 1, 2).float() / 255
    mean, std = torch.tensor(IDENTITY.mean).view(1, 3, 1, 1), torch.tensor(IDENTITY.std).view(1, 3, 1, 1)
    torch.testing.assert_close(out, (x - mean) / std, atol=1e-5, rtol=0)


def test_augment_grayscale_always():
    cfg = dataclasses.replace(AugmentConfig(), grayscale_p=1.0, jitter_p=0.0, mean=(0, 0, 0), std=(1, 1, 1))
    out = augment(_u8(8, 16), cfg, torch.Generator().manual_seed(0))
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])


@pytest.mark.parametrize(("field", "p"), [("jitter_p", 0.8), ("grayscale_p", 0.2), ("blur_p", 0.5),
                                          ("flip_p", 0.5), ("background_p", 0.5)])
def test_augment_applies_each_op_with_its_probability(field, p):
    # Only one op on, no crop: a sample is changed iff the op was drawn for it, and untouched otherwise.
    images = _u8(1000, 8)
    base = augment(images, RAW, torch.Generator().manual_seed(0))
    out = augment(images, dataclasses.replace(RAW, **{field: p}), torch.Generator().manual_seed(0))
    changed = (out != base).flatten(1).any(1).float()
    assert abs(changed.mean().item() - p) < 0.06
    if field == "flip_p":
        flipped = (out == base.flip(-1)).flatten(1).all(1)
        assert torch.equal(flipped.float(), changed)


@pytest.mark.parametrize(("i", "op"), [(0, adjust_brightness), (1, adjust_contrast), (2, adjust_saturation),
                                     (3, adjust_hue)])
def test_augment_jitter_component_is_its_op_with_a_factor_in_range(i, op):
    # One jitter component on, always: each image must be the op applied with some factor in its range.
    strength = (0.4, 0.4, 0.4, 0.1)[i]
    cfg = dataclasses.replace(RAW, jitter_p=1.0, jitter=tuple(strength if j == i else 0.0 for j in range(4)))
    images = _u8(16, 8)
    x = augment(images, RAW, torch.Generator().manual_seed(0))
    out = augment(images, cfg, torch.Generator().manual_seed(0))
    lo, hi = (1 - strength, 1 + strength) if i < 3 else (-strength, strength)
    factors = torch.linspace(lo, hi, 401)  # steps of 0.002 (0.0005 turn): residual <= ~1e-3
    candidates = op(x.repeat_interleave(401, 0), factors.repeat(16)).view(16, 401, 3, 8, 8)
    residual = (candidates - out[:, None]).abs().flatten(2).amax(2).amin(1)  # best factor, per image
    assert (residual < 5e-3).all()
    assert (out != x).flatten(1).any(1).all()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="probabilities"):
        AugmentConfig(blur_p=1.5)
    for kernel in (4, -1):
        with pytest.raises(ValueError, match="blur_kernel"):
            AugmentConfig(blur_kernel=kernel)
    assert AugmentConfig(blur_kernel=5).blur_kernel == 5


@pytest.mark.gpu
def test_augment_on_cuda_matches_building_blocks_on_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = _images()
    f = torch.tensor((0.6, 1.0, 1.4, 0.0, 2.5, 0.9))
    h = torch.tensor((-0.5, -0.1, 0.0, 0.05, 0.1, 0.5))
    for op, v in ((adjust_contrast, f), (adjust_saturation, f), (adjust_hue, h)):
        torch.testing.assert_close(op(x.cuda(), v.cuda()).cpu(), op(x, v), atol=1e-5, rtol=0)
    torch.testing.assert_close(gaussian_blur(x.cuda(), f.cuda(), 5).cpu(), gaussian_blur(x, f, 5), atol=1e-5,
                               rtol=0)
    images = _u8(64, 32).cuda()
    a = augment(images, AugmentConfig(), torch.Generator("cuda").manual_seed(0))
    b = augment(images, AugmentConfig(), torch.Generator("cuda").manual_seed(0))
    assert a.is_cuda and a.shape == (64, 3, 32, 32) and torch.equal(a, b)
    c = augment(images, AugmentConfig(), torch.Generator().manual_seed(0))  # CPU generator, CUDA images
    assert c.is_cuda and torch.isfinite(c).all()
