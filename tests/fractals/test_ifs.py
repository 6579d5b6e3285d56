"""IFS code sampling and the code bank (Anderson & Farrell 2022, §3.1; Chen et al., ICLR 2023, A.1)."""

import hashlib

import numpy as np
import pytest

from fractals.ifs import (
    MAX_MAPS,
    BankError,
    load_bank,
    sample_codes,
    sample_singular_values,
    save_bank,
    singular_values,
)


@pytest.fixture(scope="module")
def bank():
    return sample_codes(5000, seed=3)


def test_sigma_factor_sum_holds(bank):
    sv = singular_values(bank.maps)
    active = np.arange(MAX_MAPS) < bank.n_maps[:, None]
    total = ((sv[..., 0] + 2 * sv[..., 1]) * active).sum(1)
    np.testing.assert_allclose(total, bank.sigma, atol=1e-9)


def test_sigma_drawn_from_its_interval(bank):
    lo, hi = (5 + bank.n_maps) / 2, (6 + bank.n_maps) / 2
    assert np.all((bank.sigma >= lo) & (bank.sigma <= hi))


def test_singular_values_bounded_and_ordered(bank):
    sv = singular_values(bank.maps)
    assert sv.max() <= 1.0 + 1e-12
    assert np.all(sv[..., 1] <= sv[..., 0] + 1e-12)


def test_probabilities_sum_to_one_and_follow_determinants(bank):
    np.testing.assert_allclose(bank.probs.sum(1), 1.0, atol=1e-12)
    a = bank.maps[..., :4].reshape(len(bank), MAX_MAPS, 2, 2)
    det = np.abs(np.linalg.det(a))
    np.testing.assert_allclose(bank.probs, det / det.sum(1, keepdims=True), atol=1e-12)


def test_padding_maps_are_zero(bank):
    pad = np.arange(MAX_MAPS) >= bank.n_maps[:, None]
    assert np.all(bank.maps[pad] == 0) and np.all(bank.probs[pad] == 0)
    assert set(np.unique(bank.n_maps)) == {2, 3, 4}


def test_translations_in_unit_square(bank):
    active = np.arange(MAX_MAPS) < bank.n_maps[:, None]
    b = bank.maps[active][:, 4:]
    assert np.all(np.abs(b) <= 1.0) and b.std() > 0.4


def test_singular_value_sampler_handles_extremes():
    rng = np.random.default_rng(0)
    k = np.array([2, 2, 4, 4])
    sigma = np.array([3.5, 4.0, 4.5, 5.0])  # both ends of each interval
    sv = sample_singular_values(k, sigma, rng)
    np.testing.assert_allclose((sv[..., 0] + 2 * sv[..., 1]).sum(1), sigma, atol=1e-12)
    assert sv.max() <= 1.0 + 1e-12 and sv.min() >= 0.0


def test_same_seed_same_codes_different_seed_different():
    a, b, c = sample_codes(100, 7), sample_codes(100, 7), sample_codes(100, 8)
    assert np.array_equal(a.maps, b.maps)
    assert not np.array_equal(a.maps, c.maps)


def test_bank_bytes_identical_for_a_seed(tmp_path):
    paths = [tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"]
    for path, seed in zip(paths, (0, 0, 1), strict=True):
        save_bank(sample_codes(2000, seed), path)
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert digests[0] == digests[1] != digests[2]


def test_bank_round_trip(tmp_path):
    bank = sample_codes(300, 1)
    save_bank(bank, tmp_path / "bank.npz")
    loaded = load_bank(tmp_path / "bank.npz")
    for key in ("maps", "probs", "n_maps", "sigma"):
        assert np.array_equal(getattr(bank, key), getattr(loaded, key))


def test_bank_loads_without_pickle(tmp_path):
    save_bank(sample_codes(10, 1), tmp_path / "bank.npz")
    with np.load(tmp_path / "bank.npz", allow_pickle=False) as z:
        assert z["maps"].shape == (10, MAX_MAPS, 6)


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04garbage"])
def test_malformed_bank_is_rejected(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(BankError):
        load_bank(path)


def test_bank_with_wrong_arrays_is_rejected(tmp_path):
    np.savez(tmp_path / "other.npz", maps=np.zeros((3, 4, 6)))
    with pytest.raises(BankError, match="not an fpsfl bank"):
        load_bank(tmp_path / "other.npz")
    with pytest.raises(BankError, match="not found"):
        load_bank(tmp_path / "missing.npz")


def test_bank_with_expanding_map_is_rejected(tmp_path):
    bank = sample_codes(5, 0)
    bank.maps[2, 0, :4] *= 3.0  # singular values > 1: the chaos game would diverge
    save_bank(bank, tmp_path / "bank.npz")
    with pytest.raises(BankError, match="singular value"):
        load_bank(tmp_path / "bank.npz")
