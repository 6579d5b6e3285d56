"""Random 1/f noise backgrounds behind fractal views (fpsfl.base.backgrounds; an experiment of issue 38)."""

import dataclasses
import math

import pytest
import torch

from fpsfl.base import backgrounds as bgs
from fpsfl.base.images import AugmentConfig, augment, draw
from fractals.stream import augment_views

# no crop, no colour op, no blur, no flip, no normalisation: what comes out is the render (and background)
RAW = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter_p=0.0, grayscale_p=0.0, blur_p=0.0,
                    flip_p=0.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


def _renders(n: int = 8, size: int = 16) -> torch.Tensor:
    """uint8 (n, S, S, 3) renders as the fractal renderer draws them: black, a bright square (opaque), a
    dim stripe (partly covered)."""
    x = torch.zeros(n, size, size, 3, dtype=torch.uint8)
    x[:, 2:8, 2:8] = torch.tensor([200, 90, 30], dtype=torch.uint8)
    x[:, 10:12, :, 1] = 40
    return x


def _slope(field: torch.Tensor) -> float:
    """The log-log slope of the radially averaged amplitude spectrum of fields (B, 1, S, S), fitted over
    the middle frequencies (4 to S/4 cycles across)."""
    s = field.shape[-1]
    amp = torch.fft.fft2(field.double()).abs().mean((0, 1))
    fy, fx = torch.fft.fftfreq(s, dtype=torch.float64), torch.fft.fftfreq(s, dtype=torch.float64)
    radius = (torch.sqrt(fy[:, None] ** 2 + fx[None, :] ** 2) * s).round().long()
    rings = torch.arange(4, s // 4 + 1)
    mean = torch.stack([amp[radius == r].mean() for r in rings])
    x, y = rings.double().log(), mean.log()
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x * x).sum())


@pytest.mark.parametrize("slope", [1.0, 1.5, 2.0])
def test_spectral_noise_falls_as_one_over_f_to_its_slope_with_unit_std(slope):
    white = torch.randn(32, 1, 64, 64, generator=torch.Generator().manual_seed(0))
    field = bgs.spectral_noise(white, torch.full((32,), slope))
    assert abs(_slope(field) + slope) < 0.1
    assert _slope(white) == pytest.approx(0.0, abs=0.1)  # the fit itself: white noise is flat
    torch.testing.assert_close(field.mean((2, 3)), torch.zeros(32, 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(field.std((2, 3)), torch.ones(32, 1), atol=1e-5, rtol=0)


def test_backgrounds_lie_in_range_with_channels_correlated_as_stated():
    g = torch.Generator().manual_seed(1)
    noise, u = torch.randn(64, 4, 32, 32, generator=g), torch.rand(64, bgs.N_UNIFORM, generator=g)
    u[:, 4:7] = 0.0  # the lowest contrast: nothing clipped, so the correlation is the mix's
    bg = bgs.background(noise, u)
    assert bg.shape == (64, 3, 32, 32) and bg.min() >= 0 and bg.max() <= 1
    centred = bg - bg.mean((2, 3), keepdim=True)
    corr = (centred[:, 0] * centred[:, 1]).mean() / (centred[:, 0].std() * centred[:, 1].std())
    assert float(corr) == pytest.approx(bgs.SHARED ** 2 / (bgs.SHARED ** 2 + 1), abs=0.03)
    level = bg.mean((2, 3))
    assert level.min() >= bgs.LEVEL[0] - 0.02 and level.max() <= bgs.LEVEL[1] + 0.02


def test_composite_keeps_opaque_pixels_and_shows_the_background_through_the_rest():
    x = _renders().permute(0, 3, 1, 2).float()
    bg = torch.full((8, 3, 16, 16), 0.5)
    out = bgs.composite(x, bg, 255.0)
    assert torch.equal(out[:, :, 2:8, 2:8], x[:, :, 2:8, 2:8])  # the square: opaque, unchanged
    torch.testing.assert_close(out[:, :, 0], torch.full((8, 3, 16), 127.5))  # black: the background
    alpha = 40 / (bgs.OPAQUE * 255)  # the stripe: its colour over the background by 1 - alpha
    torch.testing.assert_close(out[:, 1, 10, 0], torch.full((8,), 40 + (1 - alpha) * 127.5))
    torch.testing.assert_close(out[:, 0, 10, 0], torch.full((8,), (1 - alpha) * 127.5))


def test_no_backgrounds_draw_nothing_and_backgrounds_draw_after_every_other_draw():
    """background_p 0 leaves the generator's stream as views always drew it (so old runs replay bit for
    bit); a positive one appends its draws, leaving every earlier draw as it was."""
    plain, with_bg = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    d0 = draw(AugmentConfig(), 8, 16, 16, plain, "cpu")
    d1 = draw(AugmentConfig(background_p=0.5), 8, 16, 16, with_bg, "cpu")
    assert d0.bg_on.numel() == d0.bg_noise.numel() == d0.bg_u.numel() == 0
    for a, b in zip(d0[:8], d1[:8], strict=True):
        assert torch.equal(a, b)
    assert d1.bg_noise.shape == (8, 4, 16, 16) and d1.bg_u.shape == (8, bgs.N_UNIFORM)
    assert not torch.equal(plain.get_state(), with_bg.get_state())
    # the stream without backgrounds is the one an AugmentConfig of today's other fields draws: the old
    rerun = torch.Generator().manual_seed(3)
    draw(dataclasses.replace(AugmentConfig(), background_p=0.0), 8, 16, 16, rerun, "cpu")
    assert torch.equal(rerun.get_state(), plain.get_state())


def test_each_view_gets_its_own_background_and_the_fractal_stays():
    renders = _renders().unsqueeze(0)  # one render per pair, both views from it (as shared instances)
    views = augment_views(renders, 2, dataclasses.replace(RAW, background_p=1.0),
                          torch.Generator().manual_seed(0))
    square = views[:, :, :, 2:8, 2:8] * 255
    expected = torch.tensor([200.0, 90.0, 30.0]).view(1, 1, 3, 1, 1).expand_as(square)
    torch.testing.assert_close(square, expected, atol=1e-3, rtol=0)
    black = views[:, :, :, 0]  # a row of background only
    assert (black.std(-1) > 0).all()  # not flat
    assert not torch.allclose(black[0], black[1], atol=1e-3)  # the two views' backgrounds differ
    none = augment_views(renders, 2, RAW, torch.Generator().manual_seed(0))
    assert torch.equal(none[:, :, :, 0], torch.zeros_like(none[:, :, :, 0]))


def test_float_images_are_not_changed_in_place():
    images = _renders().permute(0, 3, 1, 2).float() / 255
    before = images.clone()
    out = augment(images, dataclasses.replace(RAW, background_p=1.0), torch.Generator().manual_seed(0))
    assert torch.equal(images, before) and not torch.equal(out, before)
    assert out.min() >= 0 and out.max() <= 1 + 1e-6


def test_background_p_is_a_view_setting_and_checked():
    from fpsfl.base.views import ViewSettings
    assert ViewSettings().views().background_p == 0.0
    assert ViewSettings(background_p=0.5).views().background_p == 0.5
    with pytest.raises(ValueError, match="probabilities"):
        AugmentConfig(background_p=1.5)
    assert math.isclose(bgs.SHARED ** 2 / (bgs.SHARED ** 2 + 1), 0.8)
