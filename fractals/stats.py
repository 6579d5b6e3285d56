"""How rendered views look, in four numbers (``fractals stats``): compare a look with the official generator.

For uint8 views (N, S, S, 3) without image-level augmentation, a pixel is covered when max(R, G, B) > 0.05
(in [0, 1] units). The statistics (issue 23, item 4): the fraction of covered pixels (coverage, mean over
views, with its std across views); the mean colour difference between adjacent covered pixels (the L1
distance of their RGB colours, summed over the channels, over horizontally and vertically adjacent pairs
that are both covered); the mean of R, G and B over covered pixels; and the mean of max(R, G, B), the HSV
value, over covered pixels.
"""

from __future__ import annotations

import numpy as np

COVERED = 0.05  # max(R, G, B) above this, in [0, 1]: a covered pixel
# The official generator (andytu28/FPS_Pre-training, SelfSupGenerator as main_simsiam.py calls it at 32 px)
# as measured here: `python bench/official_fractals.py CHECKOUT --own-bank --stats --pairs 200 --seed S`,
# the mean over seeds 0-3 (ranges 0.337-0.350, 0.345-0.354, 0.361-0.370, 0.494-0.500), opencv-python-headless
# 5.0.0.93. Issue 23 gave 0.355, 0.374, 0.370, 0.502, which these runs did not reproduce.
OFFICIAL_32PX = {"coverage": 0.344, "adjacent_difference": 0.349, "covered_mean": 0.366,
                 "covered_value": 0.498}
STATS = tuple(OFFICIAL_32PX)


def view_stats(views: np.ndarray) -> dict[str, float]:
    """The four statistics of uint8 views (N, S, S, 3), plus ``coverage_std`` (the std of coverage across
    views); adjacent differences and colours are pooled over all views."""
    x = views.astype(np.float64) / 255.0  # (N, S, S, 3)
    covered = x.max(-1) > COVERED  # (N, S, S)
    coverage = covered.mean(axis=(1, 2))
    diffs = []
    for axis in (1, 2):  # vertical and horizontal neighbours
        a = np.take(x, np.arange(x.shape[axis] - 1), axis=axis)
        b = np.take(x, np.arange(1, x.shape[axis]), axis=axis)
        both = np.take(covered, np.arange(x.shape[axis] - 1), axis=axis) & np.take(
            covered, np.arange(1, x.shape[axis]), axis=axis)
        diffs.append(np.abs(a - b).sum(-1)[both])
    pooled = np.concatenate(diffs)
    colours = x[covered]  # (P, 3)
    return {"coverage": float(coverage.mean()), "coverage_std": float(coverage.std()),
            "adjacent_difference": float(pooled.mean()) if pooled.size else 0.0,
            "covered_mean": float(colours.mean()) if colours.size else 0.0,
            "covered_value": float(colours.max(-1).mean()) if colours.size else 0.0}
