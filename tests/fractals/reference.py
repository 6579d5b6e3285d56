"""Slow, plain-numpy references for the numba kernels: written for clarity, not speed."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import hsv_to_rgb

CHAINS = 4


def chaos_points(maps: np.ndarray, starts: np.ndarray, choices: np.ndarray) -> np.ndarray:
    """All points (n_steps * CHAINS, 2) visited by CHAINS chains that apply maps[choices[i, c]] at step i."""
    x, y = starts[:, 0].copy(), starts[:, 1].copy()
    points = []
    for step in choices:
        m = maps[step]  # (CHAINS, 6)
        x, y = m[:, 0] * x + m[:, 1] * y + m[:, 4], m[:, 2] * x + m[:, 3] * y + m[:, 5]
        points.append(np.stack([x, y], 1))
    return np.concatenate(points)


def chaos_canvas(maps, starts, choices, res, patch) -> tuple[np.ndarray, tuple]:
    """Reference rasterisation: hit counts on a (res + 2)^2 canvas and the bounding box."""
    pts = chaos_points(maps, starts, choices)
    x0, y0 = pts.min(0)
    x1, y1 = pts.max(0)
    span = max(x1 - x0, y1 - y0, 1e-12)
    scale = (res - 1) / span
    ox, oy = x0 - 0.5 * (span - (x1 - x0)), y0 - 0.5 * (span - (y1 - y0))
    # pixel = round((p - origin) * scale), computed as p * scale + (0.5 - origin * scale) like the kernel
    px = (pts[:, 0] * scale + (0.5 - ox * scale)).astype(np.int64) + 1
    py = (pts[:, 1] * scale + (0.5 - oy * scale)).astype(np.int64) + 1
    canvas = np.zeros((res + 2, res + 2), np.int32)
    for dy, dx in zip(*np.nonzero(patch), strict=True):
        np.add.at(canvas, (py + dy - 1, px + dx - 1), 1.0)
    return canvas, (x0, x1, y0, y1)


def dihedral(a: np.ndarray, b: np.ndarray, n: int, code: int):
    """Destination (row, col) inside an n x n instance of source pixel (a, b) under dihedral ``code``."""
    p = n - 1 - a if code & 1 else a
    q = n - 1 - b if code & 2 else b
    return (q, p) if code & 4 else (p, q)


def composite(view, gsum, cover, n, oy, ox, code, hue, sat, val) -> np.ndarray:
    """Reference of compose.composite, returning a new view (float64)."""
    out = view.astype(np.float64).copy()
    a, b = np.nonzero(cover[:n, :n] > 0)
    c = cover[a, b].astype(np.float64)
    p, q = dihedral(a, b, n, code)
    y, x = p + oy, q + ox
    keep = (y >= 0) & (y < out.shape[0]) & (x >= 0) & (x < out.shape[1])
    g = gsum[a, b] / c
    hsv = np.stack([np.mod(hue + g, 1.0), np.full_like(g, sat), np.full_like(g, val)], -1)
    rgb = hsv_to_rgb(hsv) * c[:, None]
    out[y[keep], x[keep]] = np.maximum(out[y[keep], x[keep]], rgb[keep])
    return out


def gaussian_blur(view: np.ndarray, sigma: float, radius: int) -> np.ndarray:
    """Separable Gaussian blur with clamp-to-edge borders, by explicit shifted sums."""
    t = np.arange(-radius, radius + 1)
    w = np.exp(-0.5 * t**2 / sigma**2)
    w /= w.sum()
    n = view.shape[0]
    out = view.astype(np.float64)
    for axis in (1, 0):
        acc = np.zeros_like(out)
        for wt, d in zip(w, t, strict=True):
            idx = np.clip(np.arange(n) + d, 0, n - 1)
            acc += wt * np.take(out, idx, axis=axis)
        out = acc
    return out
