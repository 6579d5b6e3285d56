"""Numba kernels that colour, transform, place and blur rendered fractals onto a view.

Chen et al., ICLR 2023, Appendix A.1.2: each fractal instance is coloured in HSV (random hue offset,
saturation U(0.3, 1), value U(0.5, 1)), randomly flipped/transposed, resized to a fraction of the canvas,
placed with up to a quarter of it off-canvas and composited on black; the view is blurred with p = 0.5.

Colouring, the dihedral transform, bilinear resizing and placement are fused into one pass over the
instance's footprint on the view, so no intermediate image is materialised.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np


@nb.njit(inline="always")
def _hsv_channel(n, h6, vs, v):
    # Branch-free HSV -> RGB for channel n in {5, 3, 1} (R, G, B); h6 = 6 * hue in [0, 6), vs = v * s.
    k = n + h6
    k = k - 6.0 if k >= 6.0 else k
    t = 4.0 - k if k > 2.0 else k  # min(k, 4 - k) on [0, 6)
    t = 1.0 if t > 1.0 else (0.0 if t < 0.0 else t)
    return v - vs * t


@nb.njit(cache=True)
def hsv_to_rgb(h, s, v):
    """HSV in [0, 1]^3 (hue wraps) to an (r, g, b) tuple in [0, 1]."""
    h6 = (h - math.floor(h)) * 6.0
    return _hsv_channel(5.0, h6, v * s, v), _hsv_channel(3.0, h6, v * s, v), _hsv_channel(1.0, h6, v * s, v)


@nb.njit(cache=True)
def _lerp_taps(dst_len, src_len, i0, i1, frac):
    # Bilinear taps (align_corners=False, edge-clamped) for resizing src_len samples to dst_len.
    step = src_len / dst_len
    for i in range(dst_len):
        s = max((i + 0.5) * step - 0.5, 0.0)
        i0[i] = min(int(s), src_len - 1)
        i1[i] = min(i0[i] + 1, src_len - 1)
        frac[i] = s - i0[i]


@nb.njit(cache=True)
def resize_bilinear(src, r, n, dst, tmp, i0, i1, frac):
    """Bilinear resize (align_corners=False) of src[:r, :r] into dst[:n, :n], separably through tmp.

    tmp: float32 (>= r, >= n); i0, i1, frac: scratch of >= max(r, n) entries.
    """
    _lerp_taps(n, r, i0, i1, frac)
    for y in range(r):  # rows: gather along x
        srow, trow = src[y], tmp[y]
        for b in range(n):
            f = np.float32(frac[b])
            trow[b] = srow[i0[b]] * (np.float32(1.0) - f) + srow[i1[b]] * f
    for a in range(n):  # columns: the resize is square, so the row taps serve; whole rows blend and vectorise
        f = np.float32(frac[a])
        t0, t1, drow = tmp[i0[a], :n], tmp[i1[a], :n], dst[a, :n]
        for b in range(n):
            drow[b] = t0[b] * (np.float32(1.0) - f) + t1[b] * f


@nb.njit(cache=True)
def hue_knots(sat, val, knots):
    """RGB at the 6 sextant starts of the hue circle and the slope to the next, knots (6, 6).

    With s and v fixed, HSV -> RGB is linear in hue within each sextant, so this table gives the exact
    colour of any hue by one linear interpolation (see :func:`composite`).
    """
    r0, g0, b0 = hsv_to_rgb(0.0, sat, val)
    for i in range(6):  # each sextant's end is the next one's start: 7 colours, not 12
        r1, g1, b1 = hsv_to_rgb((i + 1) / 6.0, sat, val)
        knots[i, 0], knots[i, 1], knots[i, 2] = r0, g0, b0
        knots[i, 3], knots[i, 4], knots[i, 5] = r1 - r0, g1 - g0, b1 - b0
        r0, g0, b0 = r1, g1, b1


@nb.njit(inline="always")
def _hue_segment(h6):
    """Which of the six HSV segments h6 = 6 * hue (in [0, 12)) falls in, wrapped, and where in it."""
    h6 = h6 - 6.0 if h6 >= 6.0 else h6
    k = min(int(h6), 5)
    return k, h6 - k


@nb.njit(inline="always")
def _placed(a, b, n, oy, ox, dihedral):
    """Where pixel (a, b) of an n x n instance lands on the view: flipped by the dihedral bits
    (1: rows, 2: columns, 4: transpose), then offset by (oy, ox)."""
    p = n - 1 - a if dihedral & 1 else a
    q = n - 1 - b if dihedral & 2 else b
    if dihedral & 4:
        p, q = q, p
    return p + oy, q + ox


@nb.njit(cache=True)
def composite(view, gsum, cover, n, oy, ox, dihedral, hue, sat, val, knots):
    """Max-composite one coloured n x n instance onto ``view`` (S, S, 3) float32.

    cover[a, b] in [0, 1] is the instance's coverage of pixel (a, b) (its hit mask, bilinearly resized
    when the instance was rendered at another size) and gsum[a, b] the coverage-weighted grade, so
    g = gsum / cover is the mean grade of the hits under it. The pixel gets colour cover * HSV(hue + g,
    sat, val) with hue in [0, 1): denser parts shift hue. dihedral (0..7): bit 0 flips rows, bit 1 flips
    columns, bit 2 then transposes. (oy, ox) is the top-left corner on the view and may lie off it.
    knots: (6, 6) scratch for :func:`hue_knots`. Iterating over the source touches only covered pixels,
    a small fraction of a fractal's box.
    """
    hue_knots(sat, val, knots)
    s_view = view.shape[0]
    for a in range(n):
        for b in range(n):
            c = cover[a, b]
            if c > 0.0:
                y, x = _placed(a, b, n, oy, ox, dihedral)
                if 0 <= y < s_view and 0 <= x < s_view:
                    # hue in [0, 1) and grade in [0, 1]: 6 (hue + grade) in [0, 12)
                    k, f = _hue_segment((hue + gsum[a, b] / c) * 6.0)
                    # Index the view directly: a per-pixel slice would cost a refcount round trip.
                    view[y, x, 0] = max(view[y, x, 0], c * (knots[k, 0] + f * knots[k, 3]))
                    view[y, x, 1] = max(view[y, x, 1], c * (knots[k, 1] + f * knots[k, 4]))
                    view[y, x, 2] = max(view[y, x, 2], c * (knots[k, 2] + f * knots[k, 5]))


@nb.njit(inline="always")
def _count_colour(count, peak, hue, opencv, knots):
    """The colour (r, g, b) float32 of a render pixel hit ``count`` times (0: black) by an instance whose
    densest pixel was hit ``peak`` times, with hue offset ``hue`` in [0, 1) and knots from :func:`hue_knots`.

    opencv: the official generator's 8-bit HSV, H = (255 grade + 255 hue) mod 256 on OpenCV's 0..180 hue
    scale (1.42 turns), grade = count / peak in float64. Else hue + grade turns with the float32 grade.
    """
    if count == 0:
        return np.float32(0.0), np.float32(0.0), np.float32(0.0)
    if opencv:
        h8 = int(count / peak * 255.0 + hue * 255.0) & 255  # the official's uint8 cast wraps mod 256
        k, f = _hue_segment(h8 / 30.0)  # 180 per turn: 6 segments of 30
    else:
        g = np.float32(count) * (np.float32(1.0) / np.float32(peak))
        k, f = _hue_segment((hue + g) * 6.0)
    return (np.float32(knots[k, 0] + f * knots[k, 3]), np.float32(knots[k, 1] + f * knots[k, 4]),
            np.float32(knots[k, 2] + f * knots[k, 5]))


@nb.njit(cache=True)
def count_colours(peak, hue, opencv, knots, table):
    """table[c] = the colour of count c for c in 0..peak (peak < len(table)); see :func:`_count_colour`."""
    for c in range(peak + 1):
        table[c, 0], table[c, 1], table[c, 2] = _count_colour(c, peak, hue, opencv, knots)


NEAR_BLACK = 0.5 / 255.0  # below this in every channel a pixel is black in uint8: it overwrites nothing


@nb.njit(cache=True)
def place_counts(view, counts, peak, r, n, oy, ox, dihedral, hue, sat, val, opencv, overwrite, knots,
                 table, i0, i1, frac):
    """Colour an instance's r x r hit ``counts`` (peak ``peak``), resize the colours bilinearly to n x n,
    flip them by ``dihedral``, place them at (oy, ox) on ``view`` (S, S, 3) float32 and composite them.

    One pass over the placed n x n instance does what colouring at render resolution, then
    :func:`resize_bilinear` of each channel, then compositing would (the official generator's order), and
    gives the same floats: each output pixel takes its four bilinear taps of the counts, skips itself when
    all four are empty, colours the taps on the fly (by a table of the counts' colours when peak fits in
    ``table`` (T, 3) float32) and blends them in resize_bilinear's order. ``overwrite``: a non-black pixel
    replaces the view's (the official); else the per-channel maximum. i0, i1, frac: scratch of >= n.
    """
    if peak <= 0:
        return  # an empty instance (e.g. a patch with no cell set) places nothing
    hue_knots(sat, val, knots)
    tabled = peak < table.shape[0]
    if tabled:
        count_colours(peak, hue, opencv, knots, table)
    _lerp_taps(n, r, i0, i1, frac)
    s_view = view.shape[0]
    one = np.float32(1.0)
    for a in range(n):
        fa = np.float32(frac[a])
        ga = one - fa
        row0, row1 = counts[i0[a]], counts[i1[a]]
        for b in range(n):
            y, x = _placed(a, b, n, oy, ox, dihedral)
            if not (0 <= y < s_view and 0 <= x < s_view):
                continue
            c0, c1 = i0[b], i1[b]
            n00, n01, n10, n11 = row0[c0], row0[c1], row1[c0], row1[c1]
            if n00 == 0 and n01 == 0 and n10 == 0 and n11 == 0:
                continue
            fb = np.float32(frac[b])
            gb = one - fb
            if tabled:
                r00, g00, b00 = table[n00, 0], table[n00, 1], table[n00, 2]
                r01, g01, b01 = table[n01, 0], table[n01, 1], table[n01, 2]
                r10, g10, b10 = table[n10, 0], table[n10, 1], table[n10, 2]
                r11, g11, b11 = table[n11, 0], table[n11, 1], table[n11, 2]
            else:
                r00, g00, b00 = _count_colour(n00, peak, hue, opencv, knots)
                r01, g01, b01 = _count_colour(n01, peak, hue, opencv, knots)
                r10, g10, b10 = _count_colour(n10, peak, hue, opencv, knots)
                r11, g11, b11 = _count_colour(n11, peak, hue, opencv, knots)
            # resize_bilinear's order: blend along the row first (both rows), then between the rows
            rr = (r00 * gb + r01 * fb) * ga + (r10 * gb + r11 * fb) * fa
            gg = (g00 * gb + g01 * fb) * ga + (g10 * gb + g11 * fb) * fa
            bb = (b00 * gb + b01 * fb) * ga + (b10 * gb + b11 * fb) * fa
            if overwrite:
                if max(rr, gg, bb) >= NEAR_BLACK:
                    view[y, x, 0], view[y, x, 1], view[y, x, 2] = rr, gg, bb
            else:
                view[y, x, 0] = max(view[y, x, 0], rr)
                view[y, x, 1] = max(view[y, x, 1], gg)
                view[y, x, 2] = max(view[y, x, 2], bb)


@nb.njit(cache=True)
def gaussian_kernel(sigma, radius, out):
    """Normalised 1-D Gaussian weights, out[0 .. 2 * radius]."""
    total = 0.0
    for t in range(2 * radius + 1):
        d = t - radius
        out[t] = math.exp(-0.5 * d * d / (sigma * sigma))
        total += out[t]
    for t in range(2 * radius + 1):
        out[t] /= total


@nb.njit(inline="always")
def _u(i):
    # Unsigned index: numba then skips its negative-index wraparound check and LLVM vectorises the loop.
    return np.uint64(i)


@nb.njit(inline="always")
def _edge_row(flat, tmp, base, row, pad, radius):
    # Input row at flat[base:] into tmp[pad:], with radius pixels replicated at each end.
    for i in range(3 * radius):
        tmp[pad + i] = flat[base + i % 3]
        tmp[pad + row + 3 * radius + i] = flat[base + row - 3 + i % 3]
    for i in range(row):
        tmp[_u(pad + 3 * radius + i)] = flat[_u(base + i)]


@nb.njit(cache=True)
def _blur3(flat, tmp, n, row, pad, w0, w1, w2):
    """:func:`gaussian_blur` with radius 1: each output is (w0 a + w1 b) + w2 c, as the general loop sums."""
    for y in range(n):
        base = y * row
        _edge_row(flat, tmp, base, row, pad, 1)
        for i in range(row):
            j = _u(pad + i)
            tmp[_u(base + i)] = w0 * tmp[j] + w1 * tmp[j + _u(3)] + w2 * tmp[j + _u(6)]
    for y in range(n):
        base, above, below = y * row, max(y - 1, 0) * row, min(y + 1, n - 1) * row
        for i in range(row):
            flat[_u(base + i)] = w0 * tmp[_u(above + i)] + w1 * tmp[_u(base + i)] + w2 * tmp[_u(below + i)]


@nb.njit(cache=True)
def gaussian_blur(view, tmp, sigma, radius, w):
    """Separable Gaussian blur of ``view`` (S, S, 3) float32 in place, clamp-to-edge borders.

    radius <= S // 2; tmp: float32 scratch of >= (S + 2) * S * 3 values; w: >= 2 * radius + 1 floats.
    Work goes row by row with one axpy per tap, so live rows stay in L1 and the loops vectorise.
    """
    gaussian_kernel(sigma, radius, w)
    n = view.shape[0]
    row = 3 * n
    taps = 2 * radius + 1
    flat = view.reshape(-1)
    pad = n * row  # tmp[:pad] holds the row-blurred image, tmp[pad:] one edge-replicated input row
    if radius == 1:  # the paper look's 3x3 kernel: one pass per axis, the same sums in the same order
        _blur3(flat, tmp, n, row, pad, np.float32(w[0]), np.float32(w[1]), np.float32(w[2]))
        return
    for y in range(n):
        base = y * row
        _edge_row(flat, tmp, base, row, pad, radius)
        for i in range(row):
            tmp[_u(base + i)] = 0.0
        for t in range(taps):
            wt = np.float32(w[t])
            for i in range(row):
                tmp[_u(base + i)] += wt * tmp[_u(pad + 3 * t + i)]
    for y in range(n):
        base = y * row
        for i in range(row):
            flat[_u(base + i)] = 0.0
        for t in range(taps):
            wt = np.float32(w[t])
            src = min(max(y + t - radius, 0), n - 1) * row
            for i in range(row):
                flat[_u(base + i)] += wt * tmp[_u(src + i)]


@nb.njit(cache=True)
def to_uint8(view, out):
    """Round float32 [0, 1] to uint8, saturating."""
    src, dst = view.reshape(-1), out.reshape(-1)
    for i in range(src.shape[0]):
        dst[i] = np.uint8(np.int32(min(255.0, max(0.0, src[i] * 255.0 + 0.5))))
