"""Numba kernels that turn IFS codes into coloured, placed fractal instances.

Chen et al., ICLR 2023, §4.2 and Appendix A.1.2 (FPS): every instance of a code is jittered, rendered with the
chaos game, coloured in HSV, flipped, resized to U(0.45, 0.75) of the canvas, placed (up to a quarter
off-canvas) and composited on black; each view is then blurred with p = 0.5.

Speed comes from three choices (see docs/performance.md):
- The view region must fit the points' bounding box, so the chains' points go to a scratch buffer while the
  box is tracked, and a second pass rasterises them. The 3x3 patch is then gathered, not scattered, into
  the counts that the colouring pass reads, with the peak count found on the way.
- Map choice is branch-free: one 64-bit draw gives 8 bytes, each indexing a 256-entry lookup table built
  from the map probabilities (so probabilities are quantised to 1/256).
- CHAINS independent chains are advanced together, which hides the latency of the serial affine update.
  Each chain starts on a fixed point of one map, a point of the attractor, so no burn-in is needed.

Randomness is a splitmix64 stream per scene, so a batch depends only on its seeds, not on batch layout.
"""

from __future__ import annotations

import numba as nb
import numpy as np

CHAINS = 4  # interleaved chaos-game chains per instance
LUT_SIZE = 256  # map-choice table entries (one random byte each)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_U53 = 1.0 / 9007199254740992.0  # 2**-53


@nb.njit(inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always")
def next_u64(st):
    """splitmix64: advance the 1-element state array ``st`` and return a 64-bit draw."""
    st[0] += _GOLDEN
    return _mix(st[0])


@nb.njit(inline="always")
def uniform(st, lo, hi):
    return lo + (hi - lo) * (np.float64(next_u64(st) >> np.uint64(11)) * _U53)


@nb.njit(cache=True)
def build_lut(probs, lut):
    """Fill ``lut`` (256 uint8) so that a uniform byte selects map k with probability ~probs[k]."""
    cum = 0.0
    t = 0
    last = 0
    for k in range(probs.shape[0]):
        if probs[k] > 0.0:
            last = k
    for k in range(last + 1):
        cum += probs[k]
        end = LUT_SIZE if k == last else min(LUT_SIZE, int(cum * LUT_SIZE + 0.5))
        while t < end:
            lut[t] = k
            t += 1


@nb.njit(cache=True)
def spectral_norm(m):
    """Largest singular value of the 2x2 linear part (m[0], m[1]; m[2], m[3])."""
    fro = m[0] * m[0] + m[1] * m[1] + m[2] * m[2] + m[3] * m[3]
    det = m[0] * m[3] - m[1] * m[2]
    disc = max(fro * fro - 4.0 * det * det, 0.0)
    return np.sqrt(0.5 * (fro + np.sqrt(disc)))


@nb.njit(cache=True)
def jitter_code(maps, n_maps, st, lo, hi, tries, translation, out, probs):
    """Copy ``maps`` (4, 6) into ``out`` with one random map scaled by U(lo, hi): its linear part, and with
    ``translation`` its translation too (the official generator scales the whole 2x3 map).

    A draw that pushes a singular value above 1 is rejected; after ``tries`` rejections the code is used
    unjittered. Probabilities are recomputed as |det A_k| / sum |det A_j| (p_k proportional to |det A_k|).
    """
    out[:] = maps
    for _ in range(tries):
        k = min(int(uniform(st, 0.0, n_maps)), n_maps - 1)
        f = uniform(st, lo, hi)
        if spectral_norm(maps[k]) * f <= 1.0:
            for j in range(6 if translation else 4):
                out[k, j] = maps[k, j] * f
            break
    total = 0.0
    for k in range(out.shape[0]):
        probs[k] = abs(out[k, 0] * out[k, 3] - out[k, 1] * out[k, 2]) if k < n_maps else 0.0
        total += probs[k]
    for k in range(out.shape[0]):
        probs[k] = probs[k] / total if total > 0.0 else (1.0 if k == 0 else 0.0)


@nb.njit(cache=True)
def chain_starts(maps, n_maps, starts):
    """Start chain c on the fixed point of map c mod K: fixed points of the maps lie on the attractor."""
    for c in range(CHAINS):
        m = maps[c % n_maps]
        det = (1.0 - m[0]) * (1.0 - m[3]) - m[1] * m[2]
        if abs(det) > 1e-9:
            starts[c, 0] = ((1.0 - m[3]) * m[4] + m[1] * m[5]) / det
            starts[c, 1] = (m[2] * m[4] + (1.0 - m[0]) * m[5]) / det
        else:  # a map with eigenvalue 1 has no unique fixed point; its translation is a fine start
            starts[c, 0], starts[c, 1] = m[4], m[5]


@nb.njit(inline="always")
def _affine(maps, k, x, y):
    return maps[k, 0] * x + maps[k, 1] * y + maps[k, 4], maps[k, 2] * x + maps[k, 3] * y + maps[k, 5]


@nb.njit(cache=True)
def map_choices(lut, n_steps, seed):
    """The map indices (n_steps, CHAINS) that the chaos-game kernels draw from ``seed``; for tests."""
    out = np.empty((n_steps, CHAINS), np.uint8)
    st = np.full(1, seed, np.uint64)
    z = np.uint64(0)
    for i in range(n_steps):
        if i % 2 == 0:
            z = next_u64(st)
        for c in range(CHAINS):
            out[i, c] = lut[(z >> np.uint64(8 * (CHAINS * (i % 2) + c))) & np.uint64(255)]
    return out


@nb.njit(inline="always")
def _step4(maps, lut, z, ax, ay, bx, by, cx, cy, dx, dy):
    """Advance the four chains once; chain c takes its map from byte c of ``z``."""
    ax, ay = _affine(maps, lut[z & np.uint64(255)], ax, ay)
    bx, by = _affine(maps, lut[(z >> np.uint64(8)) & np.uint64(255)], bx, by)
    cx, cy = _affine(maps, lut[(z >> np.uint64(16)) & np.uint64(255)], cx, cy)
    dx, dy = _affine(maps, lut[(z >> np.uint64(24)) & np.uint64(255)], dx, dy)
    return ax, ay, bx, by, cx, cy, dx, dy


@nb.njit(cache=True)
def chaos_points(maps, lut, starts, n_steps, burn, seed, xs, ys):
    """Run the chains from ``seed``: point i * CHAINS + c is chain c after step burn + i + 1, into xs, ys
    (>= n_steps * CHAINS float64 each). Returns the points' bounding box (x0, x1, y0, y1).

    Chains 1.. first run ``burn`` unrecorded steps while chain 0 is put back on its start, so that, as in the
    official generator's single chain, one chain's first points stay near the fixed point it starts on (a
    chain needs a few dozen steps to leave it; four fresh starts would show that cluster four times).
    """
    st = np.full(1, seed, np.uint64)
    ax, ay, bx, by = starts[0, 0], starts[0, 1], starts[1, 0], starts[1, 1]
    cx, cy, dx, dy = starts[2, 0], starts[2, 1], starts[3, 0], starts[3, 1]
    x0, x1, y0, y1 = np.inf, -np.inf, np.inf, -np.inf
    z = np.uint64(0)
    for i in range(burn):
        z = next_u64(st) if i % 2 == 0 else z >> np.uint64(32)
        ax, ay, bx, by, cx, cy, dx, dy = _step4(maps, lut, z, ax, ay, bx, by, cx, cy, dx, dy)
    ax, ay = starts[0, 0], starts[0, 1]
    for i in range(burn, burn + n_steps):
        z = next_u64(st) if i % 2 == 0 else z >> np.uint64(32)  # one draw serves two steps
        ax, ay, bx, by, cx, cy, dx, dy = _step4(maps, lut, z, ax, ay, bx, by, cx, cy, dx, dy)
        k = np.uint64(CHAINS * (i - burn))
        xs[k], xs[k + 1], xs[k + 2], xs[k + 3] = ax, bx, cx, dx
        ys[k], ys[k + 1], ys[k + 2], ys[k + 3] = ay, by, cy, dy
    for i in range(CHAINS * n_steps):  # the box afterwards, off the chains' critical path; this vectorises
        x, y = xs[i], ys[i]
        x0 = x if x < x0 else x0
        x1 = x if x > x1 else x1
        y0 = y if y < y0 else y0
        y1 = y if y > y1 else y1
    return x0, x1, y0, y1


@nb.njit(inline="always")
def _raster_frame(bbox, res, stretch):
    """(cx, cy, sx, sy) such that pixel = int(p * s + c) lies in [0, res - 1] for p in the box.

    ``stretch``: each side of the box spans the canvas on its own (the official generator's anisotropic fit,
    coordinates floored). Otherwise the scale is isotropic, the box's longer side spans res pixels, the
    shorter side is centred and coordinates are rounded.
    """
    x0, x1, y0, y1 = bbox
    if stretch:  # a flat box (one point wide) gets a span of 1, as the official's _extent
        sx = (res - 1) / (x1 - x0 if x1 > x0 else 1.0)
        sy = (res - 1) / (y1 - y0 if y1 > y0 else 1.0)
        return -x0 * sx, -y0 * sy, sx, sy
    span = max(x1 - x0, y1 - y0, 1e-12)
    scale = (res - 1) / span
    ox, oy = x0 - 0.5 * (span - (x1 - x0)), y0 - 0.5 * (span - (y1 - y0))
    return 0.5 - ox * scale, 0.5 - oy * scale, scale, scale


@nb.njit(inline="always")
def _pixel(x, y, cx, cy, sx, sy, w):
    # Flat offset of the point's pixel from the canvas's first interior pixel (row stride w).
    return int(y * sy + cy) * w + int(x * sx + cx)


@nb.njit(cache=True)
def chaos_raster(xs, ys, n_points, bbox, res, stretch, canvas):
    """Add 1 per point (xs, ys)[:n_points] to the int32 ``canvas`` (res + 2, res + 2), the box fitted to its
    interior by :func:`_raster_frame`."""
    cx, cy, sx, sy = _raster_frame(bbox, res, stretch)
    w = res + 2
    inner = canvas.reshape(-1)[w + 1:]
    pixels = np.empty(n_points, np.uint64)  # first all pixel offsets (a loop that vectorises), then the adds
    for i in range(n_points):
        # Unsigned indices spare numba its negative-index wraparound check (they are >= 0 by construction).
        pixels[i] = np.uint64(_pixel(xs[i], ys[i], cx, cy, sx, sy, w))
    for i in range(n_points):
        inner[pixels[i]] += 1


@nb.njit(cache=True)
def splat_gather(hits, res, patch, counts):
    """counts[y, x] = the hits under the set cells of the 3x3 ``patch`` centred on (y, x), for the res x res
    interior of the padded ``hits`` (res + 2, res + 2); returns the peak count.

    Every point stamping the patch (Anderson & Farrell 2022) equals each pixel gathering its patch-shaped
    neighbourhood of hits: the first set cell's shifted copy of the hits is written, the others' are added,
    row by row so the loops vectorise, and ``counts`` needs no zeroing. Stamps that would fall off the
    canvas are dropped, as in the official generator.
    """
    w, cw = res + 2, counts.shape[1]  # row strides: counts may be wider than res
    src, dst = hits.reshape(-1), counts.reshape(-1)
    first = True
    for q in range(9):  # cell (dy, dx) of a point at p reaches p + (dy, dx): gather from p - (dy, dx)
        if not patch[q // 3, q % 3]:
            continue
        off = (1 - (q // 3 - 1)) * w + (1 - (q % 3 - 1))
        for y in range(res):
            s0, d0 = y * w + off, y * cw
            if first:
                for x in range(res):
                    dst[np.uint64(d0 + x)] = src[np.uint64(s0 + x)]
            else:
                for x in range(res):
                    dst[np.uint64(d0 + x)] += src[np.uint64(s0 + x)]
        first = False
    if first:  # no cell set: nothing is drawn
        counts[:res, :res] = 0
        return 0
    peak = 0
    for y in range(res):
        for x in range(res):
            peak = max(peak, dst[np.uint64(y * cw + x)])
    return peak


@nb.njit(cache=True)
def chaos_game(maps, lut, starts, n_steps, burn, seed, res, stretch, hits, points, patch, counts):
    """Render one instance into ``counts`` (res, res) int32: the chains' points (:func:`chaos_points`, after
    ``burn`` steps) into the scratch ``points``
    (2, >= n_steps * CHAINS) float64 with their bounding box, rasterisation into the scratch ``hits``
    (>= (res + 2)^2 int32, zeroed here), then the 3x3 ``patch`` stamped at every point (patch[1, 1] alone:
    plain pixels; no cell set: nothing). Returns the peak count (0: empty)."""
    xs, ys = points[0], points[1]
    bbox = chaos_points(maps, lut, starts, n_steps, burn, seed, xs, ys)
    canvas = hits[: (res + 2) * (res + 2)].reshape(res + 2, res + 2)
    if not (np.isfinite(bbox[0]) and np.isfinite(bbox[1]) and np.isfinite(bbox[2]) and np.isfinite(bbox[3])):
        counts[:res, :res] = 0  # a diverging code (not from our sampler) renders empty, not out of bounds
        return 0
    canvas[:] = 0
    chaos_raster(xs, ys, n_steps * CHAINS, bbox, res, stretch, canvas)
    return splat_gather(canvas, res, patch, counts)


@nb.njit(cache=True)
def grade(counts, peak, res, graded, mask):
    """``graded`` = counts / peak (the graded canvas) and ``mask`` = 1 where hit, over res x res."""
    inv = np.float32(1.0) / np.float32(peak) if peak > 0 else np.float32(0.0)
    for y in range(res):
        for x in range(res):
            v = counts[y, x]
            graded[y, x] = np.float32(v) * inv
            mask[y, x] = 1.0 if v > 0 else 0.0
