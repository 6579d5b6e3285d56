"""The chaos-game kernels against the plain-numpy reference, given the same random draws."""

import numpy as np
import pytest

from fractals import render as R
from fractals.ifs import MAX_MAPS, sample_codes, singular_values
from tests.fractals import reference as ref


@pytest.fixture(scope="module")
def bank():
    return sample_codes(400, seed=11)


def _prepare(bank, c):
    lut = np.empty(R.LUT_SIZE, np.uint8)
    R.build_lut(bank.probs[c], lut)
    starts = np.empty((R.CHAINS, 2))
    R.chain_starts(bank.maps[c], bank.n_maps[c], starts)
    return bank.maps[c].copy(), lut, starts


def _patch(cells):
    patch = np.zeros((3, 3), np.bool_)
    for q in cells:
        patch[q // 3, q % 3] = True
    return patch


def _game(maps, lut, starts, steps, seed, res, patch, stretch=False, burn=0):
    hits = np.full((res + 2) ** 2 + 5, 7, np.int32)  # scratch: chaos_game must clear what it uses
    counts = np.full((res, res), -1, np.int32)  # every count is written (no zeroing needed)
    points = np.empty((2, steps * R.CHAINS))
    peak = R.chaos_game(maps, lut, starts, steps, burn, seed, res, stretch, hits, points, patch, counts)
    return counts, peak


@pytest.mark.parametrize("code", [0, 1, 2, 3, 57, 399])
@pytest.mark.parametrize(("res", "steps"), [(20, 250), (33, 101), (112, 2000)])
@pytest.mark.parametrize("cells", [[4], [1, 3, 4, 5, 7], list(range(9)), [0, 8], []])
@pytest.mark.parametrize(("stretch", "burn"), [(False, 0), (True, 0), (True, 32), (False, 7)])
def test_kernel_matches_numpy_reference_exactly(bank, code, res, steps, cells, stretch, burn):
    maps, lut, starts = _prepare(bank, code)
    seed = np.uint64(1234 + code)
    patch = _patch(cells)
    counts, peak = _game(maps, lut, starts, steps, seed, res, patch, stretch, burn)
    choices = R.map_choices(lut, burn + steps, seed)
    expected, expected_bbox = ref.chaos_canvas(maps, starts, choices, res, patch, stretch, burn)
    xs, ys = np.empty(steps * R.CHAINS), np.empty(steps * R.CHAINS)
    assert R.chaos_points(maps, lut, starts, steps, burn, seed, xs, ys) == expected_bbox
    np.testing.assert_array_equal(np.stack([xs, ys], 1), ref.chaos_points(maps, starts, choices, burn))
    np.testing.assert_array_equal(counts, expected)
    assert peak == expected.max()
    if cells == [4]:
        assert counts.sum() == steps * R.CHAINS  # single pixels: every point lands on the canvas


def test_burn_in_leaves_one_chain_on_its_start(bank):
    """Chain 0's first point is one step from its start; the other chains' are burn steps away."""
    maps, lut, starts = _prepare(bank, 1)
    xs, ys = np.empty(400), np.empty(400)
    R.chaos_points(maps, lut, starts, 100, 32, np.uint64(5), xs, ys)
    choice = R.map_choices(lut, 33, np.uint64(5))[32, 0]
    m = maps[choice]
    x, y = starts[0]
    np.testing.assert_allclose([xs[0], ys[0]], [m[0] * x + m[1] * y + m[4], m[2] * x + m[3] * y + m[5]])


def test_points_fill_the_canvas_box(bank):
    maps, lut, starts = _prepare(bank, 5)
    rows, cols = np.nonzero(_game(maps, lut, starts, 500, np.uint64(3), 40, _patch([4]))[0])
    # The longer side of the bounding box spans the whole canvas.
    assert (rows.min(), rows.max()) == (0, 39) or (cols.min(), cols.max()) == (0, 39)


def test_the_stretch_fit_fills_both_sides(bank):
    """The official generator's anisotropic fit: each side of the points' box spans the canvas (the far
    extreme, floored, may land one pixel short when its coordinate rounds down, as in the official)."""
    far = []
    for c in range(40):
        maps, lut, starts = _prepare(bank, c)
        rows, cols = np.nonzero(_game(maps, lut, starts, 500, np.uint64(c), 32, _patch([4]), True)[0])
        assert rows.min() == 0 and cols.min() == 0 and min(rows.max(), cols.max()) >= 30
        far += [rows.max(), cols.max()]
    assert np.mean(np.array(far) == 31) > 0.5


def test_an_empty_patch_renders_nothing(bank):
    maps, lut, starts = _prepare(bank, 2)
    counts, peak = _game(maps, lut, starts, 500, np.uint64(3), 32, _patch([]), True)
    assert peak == 0 and not counts.any()


def test_choices_follow_probabilities(bank):
    for c in (0, 1, 2):
        _, lut, _ = _prepare(bank, c)
        counts = np.bincount(R.map_choices(lut, 50_000, np.uint64(c)).ravel(), minlength=MAX_MAPS)
        freq = counts / counts.sum()
        # LUT quantisation (1/256) plus sampling noise (200K draws).
        np.testing.assert_allclose(freq, bank.probs[c], atol=1 / 256 + 0.005)


def test_lut_covers_all_entries_with_active_maps():
    lut = np.full(R.LUT_SIZE, 255, np.uint8)
    R.build_lut(np.array([0.5, 0.25, 0.25, 0.0]), lut)
    assert np.array_equal(np.bincount(lut, minlength=4), [128, 64, 64, 0])


def test_chain_starts_are_fixed_points(bank):
    for c in range(20):
        maps, _, starts = _prepare(bank, c)
        for chain in range(R.CHAINS):
            m = maps[chain % bank.n_maps[c]]
            x, y = starts[chain]
            np.testing.assert_allclose([m[0] * x + m[1] * y + m[4], m[2] * x + m[3] * y + m[5]], [x, y],
                                       atol=1e-9)


@pytest.mark.parametrize("translation", [False, True])
def test_jitter_scales_one_map_within_range(bank, translation):
    st = np.array([99], np.uint64)
    out, probs = np.empty((MAX_MAPS, 6)), np.empty(MAX_MAPS)
    factors = []
    width = 6 if translation else 4  # the official scales the whole 2x3 map, translation included
    for c in range(300):
        R.jitter_code(bank.maps[c], bank.n_maps[c], st, 0.8, 1.1, 4, translation, out, probs)
        changed = np.nonzero(np.any(out != bank.maps[c], axis=1))[0]
        assert len(changed) <= 1
        np.testing.assert_array_equal(out[:, width:], bank.maps[c][:, width:])
        assert singular_values(out).max() <= 1.0 + 1e-12
        np.testing.assert_allclose(probs.sum(), 1.0)
        if len(changed):
            k = changed[0]
            ratio = out[k, :width] / np.where(bank.maps[c, k, :width] == 0, 1.0, bank.maps[c, k, :width])
            nz = np.abs(bank.maps[c, k, :width]) > 1e-12
            np.testing.assert_allclose(ratio[nz], ratio[nz][0], rtol=1e-12)  # one factor for the whole map
            factors.append(ratio[nz][0])
    factors = np.array(factors)
    assert len(factors) > 250  # most codes can be jittered
    assert factors.min() >= 0.8 - 1e-9 and factors.max() <= 1.1 + 1e-9 and factors.std() > 0.05


def test_jitter_falls_back_to_unjittered():
    maps = np.zeros((MAX_MAPS, 6))
    maps[0, :4] = [1.0, 0.0, 0.0, 0.5]  # s1 = 1: any factor > 1 is rejected
    maps[1, :4] = [0.0, 1.0, 0.5, 0.0]
    out, probs = np.empty_like(maps), np.empty(MAX_MAPS)
    R.jitter_code(maps, 2, np.array([1], np.uint64), 1.05, 1.1, 4, True, out, probs)
    np.testing.assert_array_equal(out, maps)
    np.testing.assert_allclose(probs, [0.5, 0.5, 0.0, 0.0])


def test_spectral_norm_matches_svd(bank):
    for m in bank.maps[:50, 0]:
        assert R.spectral_norm(m) == pytest.approx(np.linalg.svd(m[:4].reshape(2, 2))[1][0], rel=1e-12)


def test_grade_normalises_by_peak():
    counts = np.zeros((4, 4), np.int32)
    counts[0, 0], counts[1, 2], counts[3, 3] = 4, 2, 1
    graded, mask = np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)
    R.grade(counts, 4, 4, graded, mask)
    assert graded[0, 0] == 1.0 and graded[1, 2] == 0.5 and graded[3, 3] == 0.25
    assert mask.sum() == 3 and graded.sum() == 1.75


def test_diverging_code_renders_empty_instead_of_crashing():
    maps = np.zeros((MAX_MAPS, 6))
    maps[0, :4] = [3.0, 0.0, 0.0, 3.0]  # expanding: points run off to infinity
    maps[0, 4:] = [1.0, 1.0]
    lut = np.zeros(R.LUT_SIZE, np.uint8)
    starts = np.full((R.CHAINS, 2), 0.5)
    counts, peak = _game(maps, lut, starts, 2000, np.uint64(1), 20, _patch([4]))
    assert peak == 0 and not counts.any()
