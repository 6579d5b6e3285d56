"""Fractal scenes rendered with batched torch ops on any device: the numba renderer of :mod:`fractals.draw`
(paper look), so that on a GPU the fractals of pre-training are drawn where the model trains (issue 40).

Chen et al., ICLR 2023, §4.2 and Appendix A.1.2 (FPS): every instance of a code is jittered, rendered with the
chaos game and a random 3x3 patch, coloured in HSV, flipped, resized to U(0.45, 0.75) of the canvas, placed
(up to a quarter off-canvas) and composited on black; each view is then blurred with p = 0.5.

:func:`render_batch` keeps the contract of :func:`fractals.scenes.render_batch` (codes and one seed per scene
in, uint8 (V, B, S, S, 3) out) and returns a tensor on ``device``. Its images equal the numba renderer's in
distribution, not bit for bit (docs/fractals.md compares their statistics):

- Randomness is counter-based: splitmix64 (the numba kernels' generator) evaluated in int64 tensor
  arithmetic at (key, counter), keys derived from the scene's seed. A scene therefore depends only on its
  seed, as in numba: a DDP shard's rows equal the full batch's, and CPU and CUDA draw the same numbers. Only
  the order of draws differs from numba's sequential stream, so the images differ.
- The chaos game is the one Python loop: over steps, each step advancing every chain of every instance at
  once (a table gather and two fused multiply-adds). Beyond ``MAX_STEPS`` steps per chain more chains are
  used instead (1,000 points: numba's 4 chains of 250 steps; 100K: 391 chains of 256), so a game is at most
  ~512 sequential steps, as kernel launches on a GPU are what a long serial loop would cost.
- Placement runs backwards: each view pixel is mapped onto the placed instance (inverse dihedral and offset,
  an affine map) and samples its colours, coloured at render resolution, with one grid_sample for all views:
  what :func:`fractals.compose.place_counts` does forwards, with no loop over pixels or instances' sizes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .compose import NEAR_BLACK
from .ifs import CodeBank
from .render import CHAINS, LUT_SIZE

MAX_STEPS = 256  # recorded steps per chain; more points get more chains (GPU: fewer sequential launches)
MIX_STEPS = 256  # unrecorded steps of those extra chains (see _chaos)
# scenes go in chunks of at most this many view pixels and chaos-game points (8 bytes each, x and y), which
# bounds the working memory (~1 GB) and leaves a 224 px batch of 256 pairs in 2 chunks
MAX_PIXELS, MAX_POINTS = 1 << 24, 1 << 26
_BLOCK = 32  # chaos-game steps whose maps are drawn and gathered at once (a multiple of 8)
_MASK = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _i64(u: int) -> int:
    """A 64-bit unsigned constant as the int64 that has its bits (torch has no uint64 arithmetic)."""
    u &= _MASK
    return u - (1 << 64) if u >= 1 << 63 else u


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    # Logical right shift: torch's >> on int64 is arithmetic, so mask off the copied sign bits.
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    # splitmix64's finaliser (fractals.render._mix); int64 products wrap modulo 2^64 as uint64 ones do.
    z = (z ^ _lsr(z, 30)) * _i64(_MIX1)
    z = (z ^ _lsr(z, 27)) * _i64(_MIX2)
    return z ^ _lsr(z, 31)


def _draw(key: torch.Tensor, i: int | torch.Tensor) -> torch.Tensor:
    """Draw ``i`` (int64 bits) of the splitmix64 stream whose state is ``key``: the state after i + 1 steps,
    mixed. Also derives sub-keys: _draw(key, i) for a draw index no other use of ``key`` takes."""
    if isinstance(i, int):
        return _mix(key + _i64((i + 1) * _GOLDEN))
    return _mix(key + (i + 1) * _i64(_GOLDEN))  # wraps modulo 2^64, as the int branch's _i64


def _uniform(key: torch.Tensor, i: int | torch.Tensor, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    """U[lo, hi) in float64 from draw ``i`` of ``key``: 53 random bits, as fractals.render.uniform."""
    return lo + (hi - lo) * (_lsr(_draw(key, i), 11).double() * 2.0**-53)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_config(cfg) -> None:
    """ValueError unless ``cfg`` (a RenderConfig) is the paper look this renderer draws; the sparse look's
    departures (aspect fit, float HSV, resize before colour, channel-max compositing) are numba's only."""
    unsupported = {"fit aspect": cfg.fit != "stretch", "hsv float": cfg.hsv != "opencv",
                   "colour_first off": not cfg.colour_first, "overwrite off": not cfg.overwrite,
                   "render_full off": not cfg.render_full}
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise ValueError(f"the torch renderer draws the paper look only; not: {', '.join(bad)} (use the "
                         f"numba renderer for --look sparse)")


def _spectral_norm(m: torch.Tensor) -> torch.Tensor:
    """Largest singular value of each map's 2x2 linear part, m (..., 6)."""
    fro = (m[..., :4] ** 2).sum(-1)
    det = m[..., 0] * m[..., 3] - m[..., 1] * m[..., 2]
    return torch.sqrt(0.5 * (fro + torch.sqrt((fro * fro - 4.0 * det * det).clamp(min=0.0))))


def _jitter(maps: torch.Tensor, n_maps: torch.Tensor, key: torch.Tensor, cfg) -> torch.Tensor:
    """fractals.render.jitter_code for N codes at once: one random map (linear part, and translation with
    cfg.jitter_translation) scaled by U(jitter), the first of cfg.jitter_tries draws that keeps its largest
    singular value <= 1; none does: the code as is. Draws 0 .. 2 tries - 1 of ``key``."""
    tries = cfg.jitter_tries
    if tries == 0:
        return maps.clone()
    t = torch.arange(tries, device=maps.device)
    k = torch.minimum((_uniform(key[:, None], t) * n_maps[:, None]).long(), n_maps[:, None] - 1)  # (N, T)
    f = _uniform(key[:, None], tries + t, *cfg.jitter)
    ok = _spectral_norm(maps).gather(1, k) * f <= 1.0
    first = ok.long().argmax(1, keepdim=True)  # argmax: the first accepted try
    k, f = k.gather(1, first)[:, 0], torch.where(ok.any(1), f.gather(1, first)[:, 0], 1.0)
    scale = torch.ones_like(maps)
    scale[torch.arange(len(maps), device=maps.device), k, :6 if cfg.jitter_translation else 4] = f[:, None]
    return maps * scale


def _map_table(m: torch.Tensor, n_maps: torch.Tensor) -> torch.Tensor:
    """(N, 256, 6) float32: the map that random byte u picks, as fractals.render.build_lut's table (p_k
    proportional to |det A_k| of the jittered maps, quantised to 1/256), so a step is one gather."""
    active = torch.arange(m.shape[1], device=m.device) < n_maps[:, None]
    det = torch.where(active, (m[..., 0] * m[..., 3] - m[..., 1] * m[..., 2]).abs(), 0.0)
    total = det.sum(1, keepdim=True)
    first = torch.zeros_like(det)
    first[:, 0] = 1.0
    probs = torch.where(total > 0.0, det / total.clamp(min=1e-300), first)
    ends = torch.floor(probs.cumsum(1) * LUT_SIZE + 0.5).clamp(max=LUT_SIZE)
    idx = torch.arange(m.shape[1], device=m.device)
    last = torch.where(probs > 0.0, idx, 0).amax(1, keepdim=True)  # the last map with p > 0 ends the table
    ends = torch.where(idx >= last, float(LUT_SIZE), ends)
    u = torch.arange(LUT_SIZE, device=m.device, dtype=ends.dtype)
    lut = (ends[:, None, :] <= u[None, :, None]).sum(-1)  # (N, 256): the first map whose end lies past u
    return m.gather(1, lut[..., None].expand(-1, -1, 6)).float()


def _chain_starts(m: torch.Tensor, n_maps: torch.Tensor, chains: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain c starts on the fixed point of map c mod K (a point of the attractor), fractals.render's
    chain_starts; a map without a unique fixed point starts it on its translation. (N, chains) each."""
    c = torch.arange(chains, device=m.device)[None, :] % n_maps[:, None]
    a, b, cc, d, e, f = m.gather(1, c[..., None].expand(-1, -1, 6)).unbind(-1)
    det = (1.0 - a) * (1.0 - d) - b * cc
    ok = det.abs() > 1e-9
    safe = torch.where(ok, det, 1.0)
    x = torch.where(ok, ((1.0 - d) * e + b * f) / safe, e)
    y = torch.where(ok, (cc * e + (1.0 - a) * f) / safe, f)
    return x.float(), y.float()


def _chaos(table: torch.Tensor, x: torch.Tensor, y: torch.Tensor, keys: torch.Tensor, steps: int,
           burn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chaos game of all chains (N, C) at once from their starts x, y: (steps, N, C) float32 x and y.

    Unrecorded steps first: chains 1..3 run ``burn`` while chain 0 is put back on its start, so that, as in
    the official generator's single chain (and fractals.render.chaos_points), one chain's first points show
    the cluster round the fixed point it starts on, not four chains'. Chains 4.. (many points) run
    max(burn, MIX_STEPS): with 256 recorded steps a chain's way off its fixed point would otherwise be a
    large share of its points (at 64 px, 391 chains after 32 steps: peak counts +19%, coverage -0.003).

    Chain c's map at step i is byte i mod 8 of draw i // 8 of its key ``keys`` (N, C): one 64-bit draw
    serves 8 steps, as in numba (where it serves 2 steps of 4 chains)."""
    n, chains = x.shape
    starts = [0 if c == 0 else burn if c < CHAINS else max(burn, MIX_STEPS) for c in range(chains)]
    total = max(starts)
    back: dict[int, tuple[int, int]] = {}  # step -> the chains (a slice) put back on their starts then
    for c, s in enumerate(starts):  # chain c leaves its start for the last time at step total - s
        back[total - s] = (back.get(total - s, (c,))[0], c + 1)
    base = (torch.arange(n, device=x.device) * LUT_SIZE)[:, None].expand(n, chains).reshape(-1)
    coef_t = table.reshape(-1, 6).t()  # (6, LUT rows): one gather a block gives every step's 6 coefficients
    keys, x0, y0 = keys.reshape(-1), x.reshape(-1), y.reshape(-1)
    xs, ys = (torch.empty(steps, n * chains, dtype=torch.float32, device=x.device) for _ in range(2))
    shifts, draws = (torch.arange(0, 64, 8, device=x.device)[None, :, None],
                     torch.arange(_BLOCK // 8, device=x.device)[:, None])
    px, py, block, out_x, out_y = x0, y0, (), xs.unbind(0), ys.unbind(0)
    # on a GPU the host's cost per op bounds this loop: a step is an unbind and 4 multiply-adds (14 torch
    # calls before), the maps drawn and their coefficients gathered once a block
    for i in range(total + steps):
        if i % _BLOCK == 0:  # the maps of the next _BLOCK steps, one draw per chain per 8 steps
            bits = _draw(keys[None, :], i // 8 + draws)[:, None, :]  # (_BLOCK / 8, 1, chains)
            rows = base + ((bits >> shifts) & 255)
            block = coef_t.index_select(1, rows.reshape(-1)).view(6, _BLOCK, -1).unbind(1)  # (6, chains)s
        if 0 < i <= total and i in back:  # these chains back on their starts (a slice: no sync)
            lo, hi = back[i]
            px.view(n, chains)[:, lo:hi], py.view(n, chains)[:, lo:hi] = x[:, lo:hi], y[:, lo:hi]
        a, b, cc, d, e, f = block[i % _BLOCK].unbind(0)
        rx, ry = (out_x[i - total], out_y[i - total]) if i >= total else (None, None)
        nx = torch.addcmul(e, a, px, out=rx).addcmul_(b, py)
        py = torch.addcmul(f, cc, px, out=ry).addcmul_(d, py)
        px = nx
    return xs.view(steps, n, chains), ys.view(steps, n, chains)


def _raster(xs: torch.Tensor, ys: torch.Tensor, res: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hits (N, res, res) int32 of the points (steps, N, C), each axis of an instance's bounding box stretched
    to the canvas and coordinates floored (fractals.render._raster_frame, stretch), and whether the box is
    finite (a diverging code renders empty)."""
    n = xs.shape[1]
    lo_x, hi_x, lo_y, hi_y = xs.amin((0, 2)), xs.amax((0, 2)), ys.amin((0, 2)), ys.amax((0, 2))
    finite = torch.isfinite(torch.stack([lo_x, hi_x, lo_y, hi_y])).all(0)
    sx = (res - 1) / torch.where(hi_x > lo_x, hi_x - lo_x, 1.0)  # a flat box gets a span of 1, as numba
    sy = (res - 1) / torch.where(hi_y > lo_y, hi_y - lo_y, 1.0)
    cx, cy = -lo_x * sx, -lo_y * sy
    hits = torch.zeros(n * res * res, dtype=torch.int64, device=xs.device)
    offset = (torch.arange(n, device=xs.device) * res * res)[None, :, None]
    chunk = max(1, (1 << 24) // max(1, xs[0].numel()))  # steps per bincount, bounding the index memory
    for s in range(0, len(xs), chunk):
        # x sx + cx = (x - min) sx >= 0 up to rounding: truncation is the floor, as numba's int(); NaN from a
        # diverging instance casts to some integer, clamped onto the canvas and dropped below (not finite)
        px = torch.addcmul(cx[None, :, None], xs[s:s + chunk], sx[None, :, None]).long().clamp_(0, res - 1)
        py = torch.addcmul(cy[None, :, None], ys[s:s + chunk], sy[None, :, None]).long().clamp_(0, res - 1)
        flat = py.mul_(res).add_(px).add_(offset)
        hits += torch.bincount(flat.reshape(-1), minlength=n * res * res)
    return hits.view(n, res, res).to(torch.int32), finite


def _patch_counts(hits: torch.Tensor, key: torch.Tensor, cfg, draw: int) -> torch.Tensor:
    """Every point stamps a random binary 3x3 patch (each cell set with p = 1/2; with probability 1 -
    cfg.patch_p, or cfg.patch_centre, the centre alone or too): counts[y, x] = the hits under the set cells
    centred on (y, x), stamps off the canvas dropped, as fractals.render.splat_gather. Draws ``draw`` and
    ``draw + 1`` of ``key``."""
    res = hits.shape[1]
    drawn = _uniform(key, draw) < cfg.patch_p
    bits = _draw(key, draw + 1)
    cells = ((bits[:, None] >> torch.arange(9, device=key.device)) & 1).bool() & drawn[:, None]
    cells[:, 4] |= ~drawn | cfg.patch_centre  # no patch drawn: each point is its own pixel
    pad = torch.nn.functional.pad(hits, (1, 1, 1, 1))
    counts = torch.zeros_like(hits)
    for q in range(9):  # cell (qy, qx) of a point at p reaches p + (qy - 1, qx - 1): gather from p - that
        qy, qx = divmod(q, 3)
        counts += cells[:, q, None, None] * pad[:, 2 - qy:2 - qy + res, 2 - qx:2 - qx + res]
    return counts


def _colour_table(hue: torch.Tensor, sat: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """(VB, 257, 3) float32: the colour of each 8-bit hue H = 0..255 on OpenCV's 0..180 scale at saturation
    ``sat`` and value ``val`` (HSV -> RGB is piecewise linear in the hue), and black last (an empty pixel)."""
    h6 = torch.arange(256, device=hue.device, dtype=torch.float32) / 30.0
    k = (torch.tensor([5.0, 3.0, 1.0], device=hue.device)[None, :] + h6[:, None]).remainder(6.0)  # R, G, B
    t = torch.minimum(k, 4.0 - k).clamp(0.0, 1.0)  # (256, 3)
    table = val[:, None, None] - (val * sat)[:, None, None] * t[None]
    return torch.cat([table, torch.zeros_like(table[:, :1])], 1)


def _view_draws(key: torch.Tensor, cfg, side: int) -> tuple[torch.Tensor, ...]:
    """Each view's draws (VB,) for one instance, from ``key``: hue offset U[0, 1), saturation and value
    floored to 1/255 (the official's uint8 S, V), dihedral bits, placed side int(U(scale) S) and top-left
    corner with up to cfg.off_canvas of the side off the view (fractals.draw._placed_size, _top_left)."""
    hue = _uniform(key, 0)
    sat = torch.floor(_uniform(key, 1, *cfg.saturation) * 255.0).float() / 255.0
    val = torch.floor(_uniform(key, 2, *cfg.value) * 255.0).float() / 255.0
    dihedral = _draw(key, 3) & 7 if cfg.flips else torch.zeros_like(key)
    f = _uniform(key, 4, *cfg.scale)
    size = (f * side if cfg.floor_placement else f * side + 0.5).long().clamp(min=1)
    off = (cfg.off_canvas * size).long()
    span = (side - size + 2 * off + (0 if cfg.floor_placement else 1)).clamp(min=1)
    oy = -off + torch.minimum((_uniform(key, 5) * span).long(), span - 1)
    ox = -off + torch.minimum((_uniform(key, 6) * span).long(), span - 1)
    return hue, sat, val, dihedral, size, oy, ox


def _place(view: torch.Tensor, counts: torch.Tensor, peak: torch.Tensor, inst: torch.Tensor,
           hue: torch.Tensor, sat: torch.Tensor, val: torch.Tensor, dihedral: torch.Tensor,
           size: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor) -> None:
    """Colour, resize, flip, place and composite one instance into each view (VB, 3, S, S) in place.

    inst (VB,): the row of ``counts`` (N, r, r) it places, -1 for none; the rest (VB,) from
    :func:`_view_draws`. The instance is coloured at render resolution in the official generator's 8-bit
    HSV (fractals.compose._count_colour, opencv: H = (255 count / peak + 255 hue) mod 256, 1.42 turns), then
    each view pixel is mapped back through the placement and the flips (bit 0 rows, bit 1 columns, bit 2
    transpose) onto the n x n placed instance, whose pixel a samples the colours bilinearly at
    (a + 0.5) r / n - 0.5, edge-clamped: compose.place_counts's resize run backwards, one grid_sample for all
    views. A pixel black in uint8 (all taps empty among them) leaves the view as it is (overwrite)."""
    vb, side = view.shape[0], view.shape[-1]
    dev = view.device
    here = inst.clamp(min=0)
    grey = counts[here].double()  # (VB, r, r)
    h8 = torch.floor(grey / peak[here].clamp(min=1)[:, None, None] * 255.0 + hue[:, None, None] * 255.0)
    h8 = torch.where(grey > 0, h8.long().remainder(256), 256)  # 256: black, an empty pixel
    h8 = h8 + 257 * torch.arange(vb, device=dev)[:, None, None]
    colours = _colour_table(hue, sat, val).reshape(-1, 3)[h8].permute(0, 3, 1, 2)  # (VB, 3, r, r)
    # View pixel (y, x) lies on placed pixel (a, b): transposed, (p, q) = (x - ox, y - oy), else (y - oy,
    # x - ox); a = n - 1 - p with bit 0, else p; b likewise with bit 1. align_corners=False puts a at
    # (a + 0.5) r / n - 0.5 source px, 2 (a + 0.5) / n - 1 in grid units, and border padding clamps it to the
    # edge pixels as compose._lerp_taps does. All of this is affine in (y, x): one affine_grid per view.
    sw = (dihedral & 4).bool()
    n = size.double()
    rows = []
    for bit, on_y in ((1, ~sw), (2, sw)):  # a (bit 1) follows the view's y unless transposed, b the other
        flip = (dihedral & bit).bool()
        sign, t = torch.where(flip, -1.0, 1.0).double(), on_y.double()
        shift = torch.where(flip, n - 1.0, 0.0) - sign * torch.where(on_y, oy, ox)
        k_y, k_x, k_0 = 2 * sign * t / n, 2 * sign * (1 - t) / n, 2 * (shift + 0.5) / n - 1.0
        # grid coordinate = k_y y + k_x x + k_0 with y = (yn + 1) S / 2 - 0.5 in affine_grid's (xn, yn) units
        rows.append(torch.stack([k_x * side / 2, k_y * side / 2, k_0 + (k_x + k_y) * (side - 1) / 2], -1))
    theta = torch.stack(rows[::-1], 1).float()  # (VB, 2, 3): grid x (b, the column) first, then grid y (a)
    at = torch.nn.functional.affine_grid(theta, [vb, 3, side, side], align_corners=False)
    inside = (at.abs() < 1.0).all(-1) & (inst >= 0)[:, None, None]  # |2 (a + 0.5) / n - 1| < 1: 0 <= a < n
    rgb = torch.nn.functional.grid_sample(colours, at, mode="bilinear", padding_mode="border",
                                          align_corners=False)  # (VB, 3, S, S)
    keep = inside[:, None] & (rgb.amax(1, keepdim=True) >= NEAR_BLACK)
    view.copy_(torch.where(keep, rgb, view))


def _blur_kernels(key: torch.Tensor, cfg, side: int) -> torch.Tensor:
    """(VB, 2 R + 1) float32 1-D kernels: with p = cfg.blur_p a Gaussian (sigma ~ U(cfg.blur_sigma), radius
    cfg.blur_radius or ceil(2 sigma), R the largest any view takes), else the identity."""
    lo, hi = cfg.blur_sigma
    reach = cfg.blur_radius or min(max(1, math.ceil(2.0 * hi)), side // 2)
    blurred = _uniform(key, 0) < cfg.blur_p
    sigma = _uniform(key, 1, lo, hi)
    radius = torch.full_like(sigma, cfg.blur_radius) if cfg.blur_radius else \
        torch.ceil(2.0 * sigma).clamp(1, side // 2)
    d = torch.arange(-reach, reach + 1, device=key.device, dtype=torch.float64)
    w = torch.exp(-0.5 * d * d / (sigma * sigma)[:, None]) * (d.abs() <= radius[:, None])
    return torch.where(blurred[:, None], w / w.sum(1, keepdim=True), (d == 0).double()).float()


def _blur(view: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Separable blur of each view (VB, 3, S, S) by its kernel w (VB, taps), clamp-to-edge borders, as
    fractals.compose.gaussian_blur: one grouped convolution per axis."""
    vb, side = view.shape[0], view.shape[-1]
    reach = w.shape[1] // 2
    w = w.repeat_interleave(3, 0)[:, None]  # (VB * 3, 1, taps): each channel its view's kernel
    x = torch.nn.functional.pad(view.reshape(1, vb * 3, side, side), (reach,) * 4, mode="replicate")
    x = torch.nn.functional.conv2d(x, w[..., None], groups=vb * 3)  # along y
    x = torch.nn.functional.conv2d(x, w[:, :, None], groups=vb * 3)  # along x
    return x.view(vb, 3, side, side)


def render_batch(bank: CodeBank, cfg, code_ids: np.ndarray, counts: np.ndarray, seeds: np.ndarray,
                 n_views: int, device: torch.device | str | None = None, max_pixels: int = MAX_PIXELS,
                 max_points: int = MAX_POINTS) -> torch.Tensor:
    """Render B scenes (codes ``code_ids[b, :counts[b]]`` of ``bank``) as uint8 (n_views, B, S, S, 3) on
    ``device`` (default: CUDA when available): :func:`fractals.scenes.render_batch` for the paper look
    (:func:`check_config`). Scene b's randomness comes from seeds[b] alone, so any split of a batch renders
    the same scenes; they are rendered in chunks of <= max_pixels view pixels and <= max_points points."""
    check_config(cfg)
    device = torch.device(device) if device is not None else default_device()
    code_ids = np.ascontiguousarray(code_ids, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if code_ids.ndim != 2 or counts.shape != (len(code_ids),) or counts.max(initial=0) > code_ids.shape[1]:
        raise ValueError("code_ids must be (B, I) and counts (B,) with counts <= I")
    seeds = torch.as_tensor(np.asarray(seeds, np.uint64).view(np.int64), device=device)
    side, n = cfg.size, len(code_ids)
    out = torch.empty((n_views, n, side, side, 3), dtype=torch.uint8, device=device)
    per_scene = code_ids.shape[1] * (1 if cfg.instances == "shared" else n_views) * cfg.points
    chunk = max(1, min(max_pixels // (n_views * side * side), max_points // max(1, per_scene)))
    for s in range(0, n, chunk):
        out[:, s:s + chunk] = _render_chunk(bank, cfg, code_ids[s:s + chunk], counts[s:s + chunk],
                                            seeds[s:s + chunk], n_views, device)
    return out


def _render_chunk(bank, cfg, code_ids, counts, seeds, n_views, device) -> torch.Tensor:
    (n_scenes, slots), side = code_ids.shape, cfg.size
    res = min(side, cfg.render_cap)  # render_full: every instance at the view's side, capped (A.1.2: 112^2)
    shared = cfg.instances == "shared"
    # instance keys: per (scene, code) when the views share instances, per (view, scene, code) otherwise
    v = torch.arange(n_views, device=device)[:, None, None]
    j = torch.arange(slots, device=device)[None, None, :]
    scene = seeds[None, :, None]
    inst_keys = _draw(_draw(scene, 1 + j), 0 if shared else v).expand(n_views, n_scenes, slots)
    present = torch.as_tensor(np.arange(slots)[None, :] < counts[:, None], device=device)
    present = present[None].expand(1 if shared else n_views, -1, -1)
    rows = present.reshape(-1).nonzero()[:, 0]  # the instances rendered, in (view,) scene, slot order
    inst = torch.full(present.shape, -1, dtype=torch.long, device=device)
    inst.view(-1)[rows] = torch.arange(len(rows), device=device)
    inst = inst.expand(n_views, -1, -1)
    view = torch.zeros((n_views * n_scenes, 3, side, side), dtype=torch.float32, device=device)
    if len(rows) == 0:  # no instance in any scene: black views, blurred as numba would
        return _finish(view, seeds, v, cfg, n_views, n_scenes)
    codes = torch.as_tensor(code_ids, device=device)[None].expand(present.shape[0], -1, -1).reshape(-1)[rows]
    key = inst_keys[:present.shape[0]].reshape(-1)[rows]
    maps = torch.as_tensor(bank.maps, device=device)[codes]
    n_maps = torch.as_tensor(bank.n_maps, device=device)[codes]
    m = _jitter(maps, n_maps, key, cfg)
    tries, chains = cfg.jitter_tries, max(CHAINS, math.ceil(cfg.points / MAX_STEPS))
    steps = math.ceil(cfg.points / chains)
    x0, y0 = _chain_starts(m, n_maps, chains)
    chain_keys = _draw(key[:, None], 2 * tries + 2 + torch.arange(chains, device=device))
    xs, ys = _chaos(_map_table(m, n_maps), x0, y0, chain_keys, steps, cfg.burn_in)
    hits, finite = _raster(xs, ys, res)
    del xs, ys
    grey = _patch_counts(hits, key, cfg, 2 * tries) * finite[:, None, None]
    peak = grey.amax((1, 2))
    view_keys = _draw(_draw(scene, 1 + slots + v), j).expand(n_views, n_scenes, slots).reshape(-1, slots)
    inst = inst.reshape(-1, slots)
    for s in range(slots):  # in slot order: a later instance covers an earlier one
        draws = _view_draws(view_keys[:, s], cfg, side)
        if cfg.colours == "shared":  # every view's hue, saturation and value: view 0's (drawn as ever)
            draws = (*(t[:n_scenes].repeat(n_views) for t in draws[:3]), *draws[3:])
        _place(view, grey, peak, inst[:, s], *draws)
    return _finish(view, seeds, v, cfg, n_views, n_scenes)


def _finish(view, seeds, v, cfg, n_views, n_scenes) -> torch.Tensor:
    """Blur the views (VB, 3, S, S) and round them to uint8 (V, B, S, S, 3), as fractals.compose.to_uint8."""
    blur_keys = _draw(_draw(seeds[None, :], 0), v[..., 0]).expand(n_views, n_scenes).reshape(-1)
    view = _blur(view, _blur_kernels(blur_keys, cfg, cfg.size))
    out = torch.floor((view * 255.0 + 0.5).clamp(0.0, 255.0)).to(torch.uint8)
    return out.permute(0, 2, 3, 1).reshape(n_views, n_scenes, cfg.size, cfg.size, 3)
