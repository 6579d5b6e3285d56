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


@pytest.mark.parametrize("code", [0, 1, 2, 3, 57, 399])
@pytest.mark.parametrize(("res", "steps"), [(20, 250), (33, 101), (112, 2000)])
@pytest.mark.parametrize("cells", [[4], [1, 3, 4, 5, 7], list(range(9))])
def test_kernel_matches_numpy_reference_exactly(bank, code, res, steps, cells):
    maps, lut, starts = _prepare(bank, code)
    seed = np.uint64(1234 + code)
    patch = _patch(cells)
    canvas = np.zeros((res + 2, res + 2), np.int32)
    bbox = R.chaos_game(maps, lut, starts, steps, seed, res, canvas, patch)
    choices = R.map_choices(lut, steps, seed)
    expected, expected_bbox = ref.chaos_canvas(maps, starts, choices, res, patch)
    assert bbox == expected_bbox
    np.testing.assert_array_equal(canvas, expected)
    assert canvas.sum() == steps * R.CHAINS * len(cells)


def test_points_fill_the_canvas_box(bank):
    maps, lut, starts = _prepare(bank, 5)
    canvas = np.zeros((42, 42), np.int32)
    R.chaos_game(maps, lut, starts, 500, np.uint64(3), 40, canvas, _patch([4]))
    rows, cols = np.nonzero(canvas)
    # The longer side of the bounding box spans the whole canvas; nothing lands in the border ring.
    assert (rows.min(), rows.max()) == (1, 40) or (cols.min(), cols.max()) == (1, 40)
    assert rows.min() >= 1 and cols.min() >= 1 and rows.max() <= 40 and cols.max() <= 40


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


def test_jitter_scales_one_map_within_range(bank):
    st = np.array([99], np.uint64)
    out, probs = np.empty((MAX_MAPS, 6)), np.empty(MAX_MAPS)
    factors = []
    for c in range(300):
        R.jitter_code(bank.maps[c], bank.n_maps[c], st, 0.8, 1.1, 5, out, probs)
        changed = np.nonzero(np.any(out != bank.maps[c], axis=1))[0]
        assert len(changed) <= 1
        np.testing.assert_array_equal(out[:, 4:], bank.maps[c][:, 4:])  # translations untouched
        assert singular_values(out).max() <= 1.0 + 1e-12
        np.testing.assert_allclose(probs.sum(), 1.0)
        if len(changed):
            k = changed[0]
            nz = np.abs(bank.maps[c, k, :4]) > 1e-12
            factors.append(np.median(out[k, :4][nz] / bank.maps[c, k, :4][nz]))
    factors = np.array(factors)
    assert len(factors) > 250  # most codes can be jittered
    assert factors.min() >= 0.8 - 1e-9 and factors.max() <= 1.1 + 1e-9 and factors.std() > 0.05


def test_jitter_falls_back_to_unjittered():
    maps = np.zeros((MAX_MAPS, 6))
    maps[0, :4] = [1.0, 0.0, 0.0, 0.5]  # s1 = 1: any factor > 1 is rejected
    maps[1, :4] = [0.0, 1.0, 0.5, 0.0]
    out, probs = np.empty_like(maps), np.empty(MAX_MAPS)
    R.jitter_code(maps, 2, np.array([1], np.uint64), 1.05, 1.1, 5, out, probs)
    np.testing.assert_array_equal(out, maps)
    np.testing.assert_allclose(probs, [0.5, 0.5, 0.0, 0.0])


def test_spectral_norm_matches_svd(bank):
    for m in bank.maps[:50, 0]:
        assert R.spectral_norm(m) == pytest.approx(np.linalg.svd(m[:4].reshape(2, 2))[1][0], rel=1e-12)


def test_grade_normalises_by_peak():
    canvas = np.zeros((6, 6), np.int32)
    canvas[1, 1], canvas[2, 3], canvas[4, 4] = 4, 2, 1
    graded, mask = np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)
    R.grade(canvas, 4, graded, mask)
    assert graded[0, 0] == 1.0 and graded[1, 2] == 0.5 and graded[3, 3] == 0.25
    assert mask.sum() == 3 and graded.sum() == 1.75


def test_diverging_code_renders_empty_instead_of_crashing():
    maps = np.zeros((MAX_MAPS, 6))
    maps[0, :4] = [3.0, 0.0, 0.0, 3.0]  # expanding: points run off to infinity
    maps[0, 4:] = [1.0, 1.0]
    lut = np.zeros(R.LUT_SIZE, np.uint8)
    starts = np.full((R.CHAINS, 2), 0.5)
    canvas = np.zeros((22, 22), np.int32)
    R.chaos_game(maps, lut, starts, 2000, np.uint64(1), 20, canvas, _patch([4]))
    assert canvas.sum() == 0
