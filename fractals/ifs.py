"""Iterated-function-system (IFS) codes and the code bank.

A code is K in {2, 3, 4} affine maps x -> A_k x + b_k chosen with probability p_k. Sampling follows
Anderson & Farrell 2022 ("Improving Fractal Pre-training", §3.1): A_k = U_k diag(s1, s2) V_k with random
rotations/reflections, singular values 0 <= s2 <= s1 <= 1 whose "sigma-factor" sum_k (s1 + 2 s2) equals
sigma ~ U[(5 + K) / 2, (6 + K) / 2], translations b_k ~ U[-1, 1]^2 and p_k proportional to |det A_k|.
Chen et al., ICLR 2023 (§4.2, Appendix A.1) pre-sample a bank of 100K such codes and draw from it.

Codes are fixed-shape arrays: ``maps`` (N, 4, 6) holds (a11, a12, a21, a22, b1, b2) per map, K padded to
MAX_MAPS with zero-probability maps; ``probs`` (N, 4); ``n_maps`` (N,); ``sigma`` (N,). A bank file is a
plain ``.npz`` (no pickles) written with fixed zip timestamps so one seed always gives identical bytes.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fpsfl.base.files import atomic_write

MAX_MAPS = 4
PAPER_BANK = 100_000  # Appendix A.1: I codes are drawn from a pre-sampled bank of 100K
BANK_FORMAT = "fpsfl-ifs-bank/1"
_BANK_KEYS = ("maps", "probs", "n_maps", "sigma")


@dataclass(frozen=True)
class CodeBank:
    """N IFS codes as fixed-shape arrays (see the module docstring for the layout)."""

    maps: np.ndarray  # (N, 4, 6) float64: a11, a12, a21, a22, b1, b2
    probs: np.ndarray  # (N, 4) float64, zero for padding maps, rows sum to 1
    n_maps: np.ndarray  # (N,) int64, K per code
    sigma: np.ndarray  # (N,) float64, the sigma-factor each code was sampled with

    def __len__(self) -> int:
        return len(self.maps)

    def subset(self, ids: np.ndarray) -> CodeBank:
        return CodeBank(self.maps[ids], self.probs[ids], self.n_maps[ids], self.sigma[ids])


def _rotation(theta: np.ndarray) -> np.ndarray:
    """Batched 2x2 rotation matrices, (..., 2, 2)."""
    c, s = np.cos(theta), np.sin(theta)
    return np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)


def sample_singular_values(
    n_maps: np.ndarray, sigma: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Singular values (N, 4, 2) with 0 <= s2 <= s1 <= 1 and sum_k (s1 + 2 s2) == sigma.

    Maps are filled one at a time. Map k may take any contribution c = s1 + 2 s2 that leaves a remainder the
    r maps after it can still absorb (each absorbs at most 3), so the constraint is met exactly; the last map
    takes the remainder. The order is then shuffled so that no map position is favoured.
    """
    n = len(n_maps)
    sv = np.zeros((n, MAX_MAPS, 2))
    rem = sigma.astype(np.float64).copy()
    for k in range(MAX_MAPS):
        active = k < n_maps
        r = n_maps - k - 1  # maps still to fill after this one
        last = r == 0
        lo1 = np.where(last, rem / 3, np.maximum(0.0, rem - 3 * r) / 3)
        hi1 = np.minimum(1.0, rem)
        s1 = rng.uniform(0.0, 1.0, n) * (hi1 - lo1) + lo1
        lo2 = np.maximum(0.0, (rem - 3 * r - s1) / 2)
        hi2 = np.minimum(s1, (rem - s1) / 2)
        s2 = np.where(last, (rem - s1) / 2, rng.uniform(0.0, 1.0, n) * (hi2 - lo2) + lo2)
        s1, s2 = np.where(active, s1, 0.0), np.where(active, np.clip(s2, 0.0, s1), 0.0)
        sv[:, k, 0], sv[:, k, 1] = s1, s2
        rem = rem - (s1 + 2 * s2)
    # Shuffle the active maps of each code; padding (key = inf) stays at the end.
    keys = np.where(np.arange(MAX_MAPS) < n_maps[:, None], rng.uniform(size=(n, MAX_MAPS)), np.inf)
    order = np.argsort(keys, axis=1)
    return np.take_along_axis(sv, order[:, :, None], axis=1)


def sample_codes(n: int, seed: int, n_maps_choices: tuple[int, ...] = (2, 3, 4)) -> CodeBank:
    """Sample n IFS codes deterministically from ``seed`` (Anderson & Farrell 2022, §3.1)."""
    if n <= 0:
        raise ValueError(f"number of codes must be positive, got {n}")
    if not set(n_maps_choices) <= {1, 2, 3, 4}:
        raise ValueError(f"maps per code must lie in 1..{MAX_MAPS}, got {n_maps_choices}")
    rng = np.random.default_rng(seed)
    k = rng.choice(np.asarray(n_maps_choices, dtype=np.int64), n)
    sigma = rng.uniform((5 + k) / 2, (6 + k) / 2)
    sv = sample_singular_values(k, sigma, rng)
    theta, phi = rng.uniform(0, 2 * np.pi, (2, n, MAX_MAPS))
    reflect = rng.choice(np.array([-1.0, 1.0]), (n, MAX_MAPS))
    # A = R(theta) diag(s1, d s2) R(phi): one reflection sign covers all of O(2) x O(2) here.
    diag = np.zeros((n, MAX_MAPS, 2, 2))
    diag[..., 0, 0], diag[..., 1, 1] = sv[..., 0], sv[..., 1] * reflect
    a = _rotation(theta) @ diag @ _rotation(phi)
    b = rng.uniform(-1.0, 1.0, (n, MAX_MAPS, 2))
    active = np.arange(MAX_MAPS) < k[:, None]
    det = np.abs(sv[..., 0] * sv[..., 1]) * active
    probs = det / det.sum(axis=1, keepdims=True)
    maps = np.concatenate([a.reshape(n, MAX_MAPS, 4), b], axis=-1) * active[..., None]
    return CodeBank(maps=maps, probs=probs, n_maps=k, sigma=sigma)


def singular_values(maps: np.ndarray) -> np.ndarray:
    """Singular values (..., 2), descending, of the linear parts of maps (..., 6)."""
    a = maps[..., :4].reshape(*maps.shape[:-1], 2, 2)
    return np.linalg.svd(a, compute_uv=False)


def save_bank(bank: CodeBank, path: str | Path) -> None:
    """Write ``bank`` as an ``.npz`` whose bytes depend only on its contents (fixed zip timestamps).

    The file appears atomically (:func:`fpsfl.base.files.atomic_write`), so a crash never leaves half a bank.
    """
    arrays = {"format": np.array(BANK_FORMAT), **{k: getattr(bank, k) for k in _BANK_KEYS}}

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, arr in arrays.items():
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, buf.getvalue())
    atomic_write(path, write)


class BankError(ValueError):
    """A bank file is missing or malformed."""


def load_bank(path: str | Path) -> CodeBank:
    """Load and validate a bank written by :func:`save_bank`; raises BankError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise BankError(f"bank file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            fmt = str(z["format"].ravel()[0]) if "format" in z.files else None
            arrays = {k: z[k] for k in _BANK_KEYS if k in z.files}
    except Exception as exc:  # zip, header or pickle errors all mean "not a bank"
        raise BankError(f"{path} is not a readable .npz bank ({type(exc).__name__}: {exc})") from None
    if fmt != BANK_FORMAT or len(arrays) != len(_BANK_KEYS):
        raise BankError(f"{path} is not an fpsfl bank (format {fmt!r}, keys {sorted(arrays)})")
    bank = CodeBank(
        maps=arrays["maps"].astype(np.float64),
        probs=arrays["probs"].astype(np.float64),
        n_maps=arrays["n_maps"].astype(np.int64),
        sigma=arrays["sigma"].astype(np.float64),
    )
    n = len(bank.maps)
    shapes_ok = (
        bank.maps.shape == (n, MAX_MAPS, 6) and bank.probs.shape == (n, MAX_MAPS)
        and bank.n_maps.shape == (n,) and bank.sigma.shape == (n,) and n > 0
    )
    if not shapes_ok:
        raise BankError(f"{path} has malformed arrays (maps {bank.maps.shape}, probs {bank.probs.shape})")
    if not (np.isfinite(bank.maps).all() and np.allclose(bank.probs.sum(1), 1.0)):
        raise BankError(f"{path} has non-finite maps or probabilities that do not sum to 1")
    if bank.n_maps.min() < 1 or bank.n_maps.max() > MAX_MAPS:
        raise BankError(f"{path} has a code with maps outside 1..{MAX_MAPS}")
    if singular_values(bank.maps).max() > 1.0 + 1e-6:
        raise BankError(f"{path} has a map with a singular value above 1 (its chaos game would diverge)")
    return bank


def bank_or_sample(path: str | Path | None, seed: int) -> CodeBank:
    """The bank at ``path`` or, without one, the paper-size bank sampled from ``seed`` (about 0.5 s)."""
    return load_bank(path) if path else sample_codes(PAPER_BANK, seed)
