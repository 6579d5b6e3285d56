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


def _counts(r, seed, peak=40):
    rng = np.random.default_rng(seed)
    counts = (rng.integers(1, peak + 1, (r, r)) * (rng.uniform(size=(r, r)) < 0.35)).astype(np.int32)
    counts[rng.integers(r), rng.integers(r)] = peak
    return counts


@pytest.mark.parametrize("opencv", [False, True])
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize(("r", "n", "code", "oy", "ox", "peak"),
                         [(32, 17, 0, 3, 4, 40), (32, 23, 5, -5, 20, 3000), (20, 20, 7, 10, -3, 9),
                          (112, 150, 6, -20, 100, 700), (40, 14, 3, 25, 25, 1)])
def test_place_counts_matches_colour_resize_composite(opencv, overwrite, r, n, code, oy, ox, peak):
    """The fused pass equals the official order done step by step: colour the counts, resize the colours
    bilinearly, flip, place, composite. Peaks above the colour table's size take the untabled path."""
    counts = _counts(r, code, peak)
    side = 32 if n < 32 else 224
    view = np.random.default_rng(1).uniform(0, 0.5, (side, side, 3)).astype(np.float32)
    view[::3] = 0.0  # black rows, where overwrite and max agree
    hue, sat, val = 0.77, 0.6, 0.9
    rgb = ref.resize_bilinear(ref.count_colours(counts, peak, hue, sat, val, opencv), n)
    expected = ref.place(view, rgb, oy, ox, code, overwrite)
    scratch = np.empty(max(r, n), np.int64), np.empty(max(r, n), np.int64), np.empty(max(r, n))
    C.place_counts(view, counts, peak, r, n, oy, ox, code, hue, sat, val, opencv, overwrite,
                   np.empty((6, 6)), np.empty((1024, 3), np.float32), *scratch)
    np.testing.assert_allclose(view, expected, atol=2e-6)


def test_opencv_hue_spans_1_42_turns():
    """H = (255 grade + 255 hue) mod 256 on a 0..180 scale: a grade of 1 from hue 0 is 255/180 turns."""
    counts = np.array([[0, 90, 180]], np.int32).repeat(3, 0)
    rgb = ref.count_colours(counts, 180, 0.0, 1.0, 1.0, True)
    assert (rgb[0, 0] == 0).all()
    np.testing.assert_allclose(rgb[0, 2], hsv_to_rgb([255 / 180 - 1, 1.0, 1.0]), atol=1e-6)
    view = np.zeros((3, 3, 3), np.float32)
    scratch = np.empty(3, np.int64), np.empty(3, np.int64), np.empty(3)
    C.place_counts(view, counts, 180, 3, 3, 0, 0, 0, 0.0, 1.0, 1.0, True, True, np.empty((6, 6)),
                   np.empty((1024, 3), np.float32), *scratch)
    np.testing.assert_allclose(view, rgb, atol=1e-6)


def test_overwrite_replaces_and_max_keeps_the_brighter():
    counts = np.ones((2, 2), np.int32)
    scratch = np.empty(2, np.int64), np.empty(2, np.int64), np.empty(2)
    results = []
    for overwrite in (True, False):
        view = np.ones((2, 2, 3), np.float32)  # white below
        C.place_counts(view, counts, 1, 2, 2, 0, 0, 0, 0.0, 1.0, 0.5, False, overwrite, np.empty((6, 6)),
                       np.empty((8, 3), np.float32), *scratch)
        results.append(view)
    np.testing.assert_allclose(results[0][0, 0], hsv_to_rgb([0.0, 1.0, 0.5]))  # pure red, value 0.5
    np.testing.assert_allclose(results[1], 1.0)
