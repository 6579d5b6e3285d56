"""Colouring, resizing, compositing and blur kernels against slow references."""

import numpy as np
import pytest
import torch
from matplotlib.colors import hsv_to_rgb

from fractals import compose as C
from tests.fractals import reference as ref


def test_hsv_matches_matplotlib():
    rng = np.random.default_rng(0)
    hsv = rng.uniform(size=(2000, 3))
    hsv[:10, 0] = [0.0, 1 / 6, 2 / 6, 0.5, 4 / 6, 5 / 6, 0.999999, 0.25, 0.75, 0.1]  # sector edges
    ours = np.array([C.hsv_to_rgb(h, s, v) for h, s, v in hsv])
    np.testing.assert_allclose(ours, hsv_to_rgb(hsv), atol=1e-12)


@pytest.mark.parametrize(("sat", "val"), [(0.3, 0.5), (1.0, 1.0), (0.0, 0.7)])
def test_hue_knots_interpolate_hsv_exactly(sat, val):
    knots = np.empty((6, 6))
    C.hue_knots(sat, val, knots)
    for h in np.linspace(0, 0.9999, 101):
        k, f = int(h * 6), h * 6 - int(h * 6)
        rgb = knots[k, :3] + f * knots[k, 3:]
        np.testing.assert_allclose(rgb, hsv_to_rgb([h, sat, val]), atol=1e-12)


def test_hue_wraps():
    assert C.hsv_to_rgb(1.25, 0.7, 0.9) == pytest.approx(C.hsv_to_rgb(0.25, 0.7, 0.9))


@pytest.mark.parametrize(("r", "n"), [(20, 20), (112, 150), (112, 100), (30, 47)])
def test_resize_matches_torch_bilinear(r, n):
    src = np.random.default_rng(r).uniform(size=(r, r)).astype(np.float32)
    dst = np.zeros((n, n), np.float32)
    tmp = np.zeros((r, n), np.float32)
    i0, i1, frac = np.zeros(max(r, n), np.int64), np.zeros(max(r, n), np.int64), np.zeros(max(r, n))
    C.resize_bilinear(src, r, n, dst, tmp, i0, i1, frac)
    expected = torch.nn.functional.interpolate(torch.from_numpy(src)[None, None], size=(n, n),
                                               mode="bilinear", align_corners=False)[0, 0].numpy()
    np.testing.assert_allclose(dst, expected, atol=1e-5)


def _instance(n, seed):
    rng = np.random.default_rng(seed)
    cover = (rng.uniform(size=(n, n)) < 0.3) * rng.uniform(0.2, 1.0, (n, n))
    gsum = cover * rng.uniform(size=(n, n))
    return gsum.astype(np.float32), cover.astype(np.float32)


@pytest.mark.parametrize("code", range(8))
@pytest.mark.parametrize(("oy", "ox"), [(3, 5), (-4, 20), (25, -6)])
def test_composite_matches_reference(code, oy, ox):
    gsum, cover = _instance(13, code)
    view = np.random.default_rng(1).uniform(0, 0.5, (32, 32, 3)).astype(np.float32)
    expected = ref.composite(view, gsum, cover, 13, oy, ox, code, 0.3, 0.6, 0.8)
    C.composite(view, gsum, cover, 13, oy, ox, code, 0.3, 0.6, 0.8, np.empty((6, 6)))
    np.testing.assert_allclose(view, expected, atol=1e-6)


def test_dihedral_codes_are_the_eight_symmetries():
    gsum, cover = _instance(9, 0)
    seen = set()
    for code in range(8):
        view = np.zeros((9, 9, 3), np.float32)
        C.composite(view, gsum, cover, 9, 0, 0, code, 0.0, 0.0, 1.0, np.empty((6, 6)))  # white: = coverage
        seen.add(view[..., 0].tobytes())
        mats = [np.rot90(cover, k) for k in range(4)]
        mats += [m.T for m in mats]
        assert any(np.allclose(view[..., 0], m) for m in mats)
    assert len(seen) == 8


@pytest.mark.parametrize(("sigma", "radius", "side"),
                         [(0.5, 1, 32), (1.0, 2, 32), (2.0, 4, 40), (0.3, 3, 16)])
def test_blur_matches_reference(sigma, radius, side):
    view = np.random.default_rng(side).uniform(size=(side, side, 3)).astype(np.float32)
    expected = ref.gaussian_blur(view, sigma, radius)
    tmp = np.zeros((side + 2) * side * 3 + 6 * side, np.float32)
    C.gaussian_blur(view, tmp, sigma, radius, np.zeros(2 * radius + 1))
    np.testing.assert_allclose(view, expected, atol=1e-5)


def test_blur_preserves_constant_image():
    view = np.full((20, 20, 3), 0.7, np.float32)
    C.gaussian_blur(view, np.zeros(2000, np.float32), 1.5, 3, np.zeros(7))
    np.testing.assert_allclose(view, 0.7, atol=1e-6)


def test_to_uint8_rounds_and_saturates():
    view = np.array([[[-0.5, 0.0, 0.5], [1.0, 1.7, 0.2]]], np.float32).reshape(1, 2, 3)
    out = np.zeros((1, 2, 3), np.uint8)
    C.to_uint8(view, out)
    assert out.tolist() == [[[0, 0, 128], [255, 255, 51]]]


def test_colour_first_matches_hsv_of_the_grade():
    """The official order: each hit pixel coloured HSV(hue + count / max, s, v), black elsewhere."""
    rng = np.random.default_rng(3)
    r = 17
    graded = rng.uniform(size=(r + 3, r + 3)).astype(np.float32)
    mask = (rng.uniform(size=(r + 3, r + 3)) < 0.4).astype(np.float32)
    rgb = np.full((3, r + 3, r + 3), -1, np.float32)
    C.colour(graded, mask, r, 0.8, 0.6, 0.9, np.empty((6, 6)), rgb)
    want = hsv_to_rgb(np.stack([np.mod(0.8 + graded[:r, :r], 1.0), np.full((r, r), 0.6),
                                np.full((r, r), 0.9)], -1)) * mask[:r, :r, None]
    np.testing.assert_allclose(rgb[:, :r, :r].transpose(1, 2, 0), want, atol=1e-6)


@pytest.mark.parametrize(("code", "oy", "ox"), [(0, 3, 4), (5, -2, 20), (7, 10, -3)])
def test_composite_rgb_places_flips_and_maxes(code, oy, ox):
    rng = np.random.default_rng(code)
    n, side = 9, 24
    rgb = (rng.uniform(size=(3, n, n)) * (rng.uniform(size=(1, n, n)) < 0.5)).astype(np.float32)
    view = rng.uniform(0, 0.5, size=(side, side, 3)).astype(np.float32)
    want = view.copy()
    for a, b in zip(*np.nonzero(rgb.max(0) > 0), strict=True):
        p, q = ref.dihedral(a, b, n, code)
        y, x = p + oy, q + ox
        if 0 <= y < side and 0 <= x < side:
            want[y, x] = np.maximum(want[y, x], rgb[:, a, b])
    C.composite_rgb(view, rgb, n, oy, ox, code)
    np.testing.assert_allclose(view, want)
