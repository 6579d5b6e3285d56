"""The compiled loop that renders a batch of scenes, and the steps of one fractal instance in it.

Chen et al., ICLR 2023, §4.2 and Appendix A.1.2 (FPS): an instance of a code is jittered, rendered with the
chaos game and a 3x3 patch, then coloured, flipped, resized, placed and composited onto a view; each view
may then be blurred. With shared instances (the official generator's per-class cache, issue 23) the first
half runs once per code of a scene and both views place its result. Configuration and the batch APIs live
in :mod:`fractals.scenes`; ``prm`` is its kernel-parameter tuple.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .compose import composite, gaussian_blur, place_counts, resize_bilinear, to_uint8
from .ifs import MAX_MAPS
from .render import (
    CHAINS,
    LUT_SIZE,
    build_lut,
    chain_starts,
    chaos_game,
    grade,
    jitter_code,
    next_u64,
    uniform,
)

COLOUR_TABLE = 1024  # counts up to this many hits are coloured by table (about 100 at 32 px)


@nb.njit(cache=True)
def _scratch(side, n_codes, prm):
    """Work buffers reused by every instance of a batch (allocation per instance would dominate at 32 px);
    the jittered codes, patches and hit counts are kept per code of a scene (n_codes), for shared
    instances."""
    cap = prm.render_cap
    big = max(1, int(prm.scale_hi * side + 0.5))  # largest instance side
    return (
        np.empty((cap + 2) * (cap + 2), np.int32),  # 0: single hits, padded
        np.empty((n_codes, cap, cap), np.int32), np.empty(n_codes, np.int64),  # 1, 2: counts, peak per code
        np.empty((cap, cap), np.float32), np.empty((cap, cap), np.float32),  # 3, 4: grade and hit mask
        np.empty((big, big), np.float32), np.empty((big, big), np.float32),  # 5, 6: the same, resized
        np.empty((cap, big), np.float32),  # 7: resize rows
        np.empty(max(cap, big), np.int64), np.empty(max(cap, big), np.int64), np.empty(max(cap, big)),  # 8-10
        np.empty((n_codes, MAX_MAPS, 6)), np.empty(MAX_MAPS),  # 11, 12: jittered code, its probabilities
        np.empty((n_codes, LUT_SIZE), np.uint8),  # 13: map-choice table
        np.empty((n_codes, CHAINS, 2)), np.zeros((n_codes, 3, 3), np.bool_), np.empty((6, 6)),  # 14-16
        np.empty((COLOUR_TABLE, 3), np.float32), np.empty(n_codes, np.uint64),  # 17, 18: colours, game seeds
        np.empty((2, prm.n_steps * CHAINS)),  # 19: the chains' points
        np.empty((n_codes, 3)),  # 20: view 0's hue offset, saturation and value per code (shared colours)
    )


@nb.njit(inline="always")
def _jitter(j, code, n_maps, st, prm, work):
    """Instance j's jittered code, its map-choice table and its chain starts (work[11, 13, 14][j])."""
    m, probs, lut, starts = work[11][j], work[12], work[13][j], work[14][j]
    jitter_code(code, n_maps, st, prm.jit_lo, prm.jit_hi, prm.jit_tries, prm.jit_translation, m, probs)
    build_lut(probs, lut)
    chain_starts(m, n_maps, starts)


@nb.njit(inline="always")
def _placed_size(st, prm, side):
    f = uniform(st, prm.scale_lo, prm.scale_hi)
    return max(1, int(f * side)) if prm.floor_placement else max(1, int(f * side + 0.5))


@nb.njit(inline="always")
def _top_left(st, prm, side, size):
    """Top-left corner (oy, ox) of a placed instance of side ``size``, keeping >= 1 - off_canvas of each of
    its sides on the view: [-off, side - size + off), the official's open right bound, or closed."""
    off = int(prm.off_canvas * size)
    # (at least one position: a view-filling instance, as a single-fractal image, sits at (0, 0))
    span = max(1, side - size + 2 * off + (0 if prm.floor_placement else 1))
    oy = -off + min(int(uniform(st, 0.0, span)), span - 1)
    ox = -off + min(int(uniform(st, 0.0, span)), span - 1)
    return oy, ox


@nb.njit(inline="always")
def _patch_and_seed(j, st, prm, work):
    """Instance j's 3x3 patch (work[15][j]) and chaos-game seed (work[18][j])."""
    patch = work[15][j]
    patch[:] = False
    drawn = uniform(st, 0.0, 1.0) < prm.patch_p
    if drawn:
        bits = next_u64(st)
        for q in range(9):
            patch[q // 3, q % 3] = ((bits >> np.uint64(q)) & np.uint64(1)) != 0
    if prm.patch_centre or not drawn:  # no patch: each point is its own pixel
        patch[1, 1] = True
    work[18][j] = next_u64(st)


@nb.njit(inline="always")
def _rasterise(j, r, prm, work):
    """Render instance j at r x r px: chaos game and patch into its hit counts work[1][j], peak work[2][j]."""
    work[2][j] = chaos_game(work[11][j], work[13][j], work[14][j], prm.n_steps, prm.burn_in, work[18][j], r,
                            prm.stretch, work[0], work[19], work[15][j], work[1][j])


@nb.njit(inline="always")
def _colour(v, j, st, prm, work):
    """Instance j's hue offset, saturation and value in view v: drawn (and kept for later views), or with
    shared colours view 0's for every later view (no draw)."""
    kept = work[20][j]
    if prm.shared_colour and v > 0:
        return kept[0], kept[1], kept[2]
    hue = uniform(st, 0.0, 1.0)
    sat = uniform(st, prm.sat_lo, prm.sat_hi)
    val = uniform(st, prm.val_lo, prm.val_hi)
    if prm.opencv:  # 8-bit S and V, as the official's np.uint8(U * 255)
        sat, val = math.floor(sat * 255.0) / 255.0, math.floor(val * 255.0) / 255.0
    kept[0], kept[1], kept[2] = hue, sat, val
    return hue, sat, val


@nb.njit(inline="always")
def _place(view, v, j, r, size, st, prm, work):
    """Colour, flip, resize to ``size`` and place instance j's r x r render (work[1, 2][j]) onto view v,
    ``view``."""
    counts, peak = work[1][j], work[2][j]
    graded, mask, big_g, big_c, rows, i0, i1, frac = work[3:11]
    knots, table = work[16], work[17]
    side = view.shape[0]
    hue, sat, val = _colour(v, j, st, prm, work)
    dihedral = np.int64(next_u64(st) & np.uint64(7)) if prm.flips else np.int64(0)
    oy, ox = _top_left(st, prm, side, size)
    if prm.colour_first:  # the official order: colour at render resolution, resize the colours, composite
        place_counts(view, counts, peak, r, size, oy, ox, dihedral, hue, sat, val, prm.opencv, prm.overwrite,
                     knots, table, i0, i1, frac)
        return
    grade(counts, peak, r, graded, mask)
    if r != size:  # rendered at another size: resize grade and mask together
        resize_bilinear(graded, r, size, big_g, rows, i0, i1, frac)
        resize_bilinear(mask, r, size, big_c, rows, i0, i1, frac)
        graded, mask = big_g, big_c
    composite(view, graded, mask, size, oy, ox, dihedral, hue, sat, val, knots)


@nb.njit(inline="always")
def _render_size(prm, side, size):
    return min(side if prm.render_full else size, prm.render_cap)


@nb.njit(inline="always")
def _keep_grey(grey, v, b, j, r, work):
    # Debug output for tests: the grey render (counts / peak) that view v of scene b placed for code j.
    if grey.shape[0] > 0 and work[2][j] > 0:
        for y in range(r):
            for x in range(r):
                grey[v, b, j, y, x] = work[1][j, y, x] / work[2][j]


@nb.njit(cache=True, nogil=True)
def render_scenes(maps, n_maps, code_ids, counts, seeds, prm, out, grey):
    """Render scenes into ``out`` (V, B, S, S, 3) uint8.

    Scene b of view v composites instances of codes code_ids[b, :counts[b]]; all of its randomness (jitter,
    chaos game, colour, flips, size, placement, blur) comes from seeds[b]. With ``prm.shared`` each code is
    jittered and rendered once per scene and every view places that same grey instance (the official
    generator's cache); otherwise every view renders its own instance. With ``prm.shared_colour`` every
    view colours an instance as view 0 drew it (view 0's draws are those of own colours). ``grey``
    (V, B, I, R, R) float32, or empty to skip, receives the grade each view placed, at its render side R
    (for tests).
    """
    n_views, n_scenes, side = out.shape[0], out.shape[1], out.shape[2]
    work = _scratch(side, max(1, code_ids.shape[1]), prm)
    view = np.empty((side, side, 3), np.float32)
    blur_tmp = np.empty((side + 2) * side * 3 + 6 * side, np.float32)  # radius <= side // 2
    weights = np.empty(side + 1)
    st = np.empty(1, np.uint64)
    for b in range(n_scenes):
        st[0] = seeds[b]
        if prm.shared:  # one jitter, patch and chaos game per code, drawn before any view
            for j in range(counts[b]):
                c = code_ids[b, j]
                _jitter(j, maps[c], n_maps[c], st, prm, work)
                _patch_and_seed(j, st, prm, work)
                if prm.render_full:
                    _rasterise(j, _render_size(prm, side, side), prm, work)
        for v in range(n_views):
            view[:] = 0.0
            for j in range(counts[b]):
                c = code_ids[b, j]
                if not prm.shared:  # the draw order of independent instances: jitter, size, patch, game, ...
                    _jitter(j, maps[c], n_maps[c], st, prm, work)
                size = _placed_size(st, prm, side)
                r = _render_size(prm, side, size)
                if not prm.shared:
                    _patch_and_seed(j, st, prm, work)
                if not (prm.shared and prm.render_full):  # a shared instance replays its points at this size
                    _rasterise(j, r, prm, work)
                _keep_grey(grey, v, b, j, r, work)
                _place(view, v, j, r, size, st, prm, work)
            if uniform(st, 0.0, 1.0) < prm.blur_p:
                sigma = uniform(st, prm.blur_lo, prm.blur_hi)
                radius = prm.blur_radius or min(max(1, int(math.ceil(2.0 * sigma))), side // 2)
                gaussian_blur(view, blur_tmp, sigma, radius, weights)
            to_uint8(view, out[v, b])
