"""How rendered views look, in three numbers (``fractals stats``): compare a look with the official generator.

For uint8 views (N, S, S, 3) without image-level augmentation: the fraction of non-black pixels (coverage),
the mean colour difference between adjacent covered pixels (speckle: the L1 distance of their RGB colours
in [0, 1] units, summed over the channels, over horizontally and vertically adjacent pairs that are both
covered) and the mean HSV value (max of R, G, B in [0, 1]) of covered pixels (brightness). On 200 pairs
at 32 px the official generator (andytu28/FPS_Pre-training, ``SelfSupGenerator`` as its
``main_simsiam.py`` calls it) measured 0.36 ± 0.09, 0.36 and 0.37 (Chen et al., ICLR 2023's own
pipeline; figures from the issue that asked for this check, not re-run here).
"""

from __future__ import annotations

import numpy as np

OFFICIAL_32PX = {"coverage": 0.36, "coverage_std": 0.09, "adjacent_difference": 0.36, "covered_value": 0.37}


def view_stats(views: np.ndarray) -> dict[str, float]:
    """The three statistics of uint8 views (N, S, S, 3): per-view coverage mean and std, and the pooled
    adjacent difference and covered value."""
    x = views.astype(np.float64) / 255.0  # (N, S, S, 3)
    covered = x.max(-1) > 0  # (N, S, S)
    coverage = covered.mean(axis=(1, 2))
    diffs = []
    for axis in (1, 2):  # vertical and horizontal neighbours
        a = np.take(x, np.arange(x.shape[axis] - 1), axis=axis)
        b = np.take(x, np.arange(1, x.shape[axis]), axis=axis)
        both = np.take(covered, np.arange(x.shape[axis] - 1), axis=axis) & np.take(
            covered, np.arange(1, x.shape[axis]), axis=axis)
        diffs.append(np.abs(a - b).sum(-1)[both])
    value = x.max(-1)[covered]
    return {"coverage": float(coverage.mean()), "coverage_std": float(coverage.std()),
            "adjacent_difference": float(np.concatenate(diffs).mean()) if any(len(d) for d in diffs) else 0.0,
            "covered_value": float(value.mean()) if value.size else 0.0}
