"""Slow, plain-numpy references for the numba kernels: written for clarity, not speed."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import hsv_to_rgb

CHAINS = 4


def chaos_points(maps: np.ndarray, starts: np.ndarray, choices: np.ndarray, burn: int = 0) -> np.ndarray:
    """The points ((n_steps - burn) * CHAINS, 2) visited by CHAINS chains that apply maps[choices[i, c]] at
    step i, counted from step ``burn`` on, where chain 0 is put back on its start."""
    x, y = starts[:, 0].copy(), starts[:, 1].copy()
    points = []
    for i, step in enumerate(choices):
        if i == burn:
            x[0], y[0] = starts[0]
        m = maps[step]  # (CHAINS, 6)
        x, y = m[:, 0] * x + m[:, 1] * y + m[:, 4], m[:, 2] * x + m[:, 3] * y + m[:, 5]
        if i >= burn:
            points.append(np.stack([x, y], 1))
    return np.concatenate(points)


def chaos_canvas(maps, starts, choices, res, patch, stretch=False, burn=0) -> tuple[np.ndarray, tuple]:
    """Reference rasterisation: hit counts (res, res) of every point stamping the set cells of ``patch``
    (stamps off the canvas dropped) and the bounding box. ``stretch``: each side of the box spans the canvas
    and coordinates are floored (the official generator); else the longer side does, the shorter is centred,
    and coordinates are rounded."""
    pts = chaos_points(maps, starts, choices, burn)
    x0, y0 = pts.min(0)
    x1, y1 = pts.max(0)
    if stretch:
        sx = (res - 1) / (x1 - x0 if x1 > x0 else 1.0)
        sy = (res - 1) / (y1 - y0 if y1 > y0 else 1.0)
        cx, cy = -x0 * sx, -y0 * sy  # pixel = floor((p - p0) * s), computed as p * s - p0 * s like the kernel
    else:
        span = max(x1 - x0, y1 - y0, 1e-12)
        sx = sy = (res - 1) / span
        ox, oy = x0 - 0.5 * (span - (x1 - x0)), y0 - 0.5 * (span - (y1 - y0))
        cx, cy = 0.5 - ox * sx, 0.5 - oy * sy  # pixel = round((p - origin) * scale)
    px = (pts[:, 0] * sx + cx).astype(np.int64)
    py = (pts[:, 1] * sy + cy).astype(np.int64)
    canvas = np.zeros((res + 2, res + 2), np.int32)
    for dy, dx in zip(*np.nonzero(patch), strict=True):
        np.add.at(canvas, (py + dy, px + dx), 1)
    return canvas[1:-1, 1:-1], (x0, x1, y0, y1)


def count_colours(counts, peak, hue, sat, val, opencv) -> np.ndarray:
    """Colours (r, r, 3) float32 of hit counts: black where 0, else HSV of the grade count / peak.

    opencv: the official generator's 8-bit HSV, H = floor(255 grade + 255 hue) mod 256 on OpenCV's
    0..180 hue scale; else hue + grade turns with the grade in float32."""
    if opencv:
        h = np.floor(counts / peak * 255.0 + hue * 255.0) % 256 / 180.0
    else:
        h = hue + counts.astype(np.float32) * (np.float32(1.0) / np.float32(peak))
    hsv = np.stack([np.mod(h, 1.0), np.full(counts.shape, sat), np.full(counts.shape, val)], -1)
    return np.where((counts > 0)[..., None], hsv_to_rgb(hsv), 0.0).astype(np.float32)


def resize_bilinear(img: np.ndarray, n: int) -> np.ndarray:
    """Bilinear resize (align_corners=False, edge-clamped) of (r, r, C) float32 to (n, n, C): rows, then
    columns, in float32."""
    r = img.shape[0]
    s = np.maximum((np.arange(n) + 0.5) * (r / n) - 0.5, 0.0)
    i0 = np.minimum(s.astype(np.int64), r - 1)
    i1 = np.minimum(i0 + 1, r - 1)
    f = (s - i0).astype(np.float32)[:, None]
    g = np.float32(1.0) - f
    rows = img[:, i0] * g[None] + img[:, i1] * f[None]  # (r, n, C)
    return rows[i0] * g[:, None] + rows[i1] * f[:, None]


def place(view, rgb, oy, ox, code, overwrite) -> np.ndarray:
    """Flip the n x n colours ``rgb`` by dihedral ``code``, place them at (oy, ox) and composite them onto a
    copy of ``view``: a pixel that is not black in uint8 replaces the view's (overwrite), or the maximum."""
    out = view.copy()
    n = rgb.shape[0]
    for a in range(n):
        for b in range(n):
            p, q = dihedral(a, b, n, code)
            y, x = p + oy, q + ox
            if not (0 <= y < out.shape[0] and 0 <= x < out.shape[1]):
                continue
            if overwrite:
                if rgb[a, b].max() * 255.0 >= 0.5:
                    out[y, x] = rgb[a, b]
            else:
                out[y, x] = np.maximum(out[y, x], rgb[a, b])
    return out


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
