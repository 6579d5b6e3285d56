"""Batches of fractal scenes: FPS pairs, multi-label images and single-fractal images.

Chen et al., ICLR 2023: Fractal Pair Similarity (§4.2, Fig. 2c, Appendix A.1.2) draws I distinct codes per
pair and places an instance of each in both views. By default (``instances="shared"``) the two views place
the same jittered, rendered grey instance and differ in colour, flips, size, placement and blur, as the
official generator does (it caches one grey render per class and both views take it from that cache;
issue 23); ``instances="independent"`` renders an independently jittered instance per view. The Table 6
baselines are multi-label fractal images (Anderson & Farrell 2022: J classes, I fractals per image,
multi-hot label) and single-fractal images whose two views come from image-level augmentation only
("fractal + SimSiam").

All scene randomness below the choice of codes comes from one 64-bit seed per scene, consumed inside one
compiled call per batch (:func:`render_scenes`).
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from .draw import render_scenes
from .ifs import CodeBank
from .render import CHAINS

LOOKS = ("paper", "sparse")  # see RenderConfig.preset
INSTANCES = ("shared", "independent")  # see RenderConfig.instances
COLOURS = ("own", "shared")  # see RenderConfig.colours
FITS = ("stretch", "aspect")
HSVS = ("opencv", "float")
# How the first renderers departed from the official generator in detail (issue 23, item 3); the sparse
# look keeps them
SPARSE_RESIDUALS = dict(jitter_tries=5, jitter_translation=False, fit="aspect", patch_centre=True,
                        hsv="float", overwrite=False, floor_placement=False, burn_in=0)
ALL = slice(None)  # every row of a batch


@dataclass(frozen=True)
class RenderConfig:
    """How one view is rendered. Defaults are the 32 px setting of the official generator's look; see
    :meth:`preset` for 224 px and for the ``sparse`` look of this project's first renderer."""

    size: int = 32  # output side, px (32 px for CIFAR-scale pre-training, §4.2)
    points: int = 1000  # chaos-game points per instance (Appendix A.1.2: 1K at 32 px, 100K at 224 px)
    # steps chains 1.. run before their points count, so one chain, not four, shows the cluster round its
    # starting fixed point, as the official's single chain (with none, coverage is about 0.01 lower)
    burn_in: int = 32
    render_cap: int = 112  # instances larger than this many px are rendered at cap^2, then resized (A.1.2)
    codes_per_image: tuple[int, int] = (2, 2)  # I ~ U{lo..hi} distinct codes (A.1.2: I = 2 at 32 px)
    scale: tuple[float, float] = (0.45, 0.75)  # instance side / view side, uniform (A.1.2)
    off_canvas: float = 0.25  # fraction of an instance's side allowed outside the view (A.1.2)
    jitter: tuple[float, float] = (0.8, 1.1)  # factor on one random map (A.1.2; official _basic_jitter)
    jitter_tries: int = 4  # draws (a singular value > 1 rejects one) before rendering unjittered (official)
    jitter_translation: bool = True  # the factor scales the map's translation too (official: the 2x3 map)
    fit: str = "stretch"  # stretch: each side of the points' box spans the render (official); aspect: kept
    patch_centre: bool = False  # force the patch's centre cell on; official: it is one of 9 random cells
    saturation: tuple[float, float] = (0.3, 1.0)  # HSV saturation, uniform (A.1.2)
    value: tuple[float, float] = (0.5, 1.0)  # HSV value, uniform (A.1.2)
    flips: bool = True  # random flips / transpose of each instance (the 8 dihedral symmetries)
    patch_p: float = 1.0  # probability that an instance stamps a random 3x3 binary patch at every point
    blur_p: float = 0.5  # probability of a Gaussian blur of the whole view (A.1.2)
    blur_sigma: tuple[float, float] = (0.5, 2.0)  # blur sigma, px of the output, uniform
    blur_radius: int = 1  # px: a 3x3 kernel, as the official generator; 0: ceil(2 sigma)
    render_full: bool = True  # render each instance at the view's side, then resize it to its placed size
    colour_first: bool = True  # colour at render resolution, then resize the colours (else resize, colour)
    # opencv: the official's 8-bit HSV, hue (255 grade + U[0, 255)) mod 256 on a 0..180 scale (1.42 turns),
    # S and V floored to 1/255; float: hue U[0, 1) + grade turns (colour_first only for opencv)
    hsv: str = "opencv"
    overwrite: bool = True  # a non-black instance pixel replaces the view's (official); else channel max
    floor_placement: bool = True  # side int(f S), top-left in [-s//4, S - s + s//4) (official); else rounded
    # shared: each code of a scene is jittered and rendered once and every view places that grey instance,
    # as the official generator's per-class cache does; independent: each view renders its own instance
    instances: str = "shared"
    # own: each view draws every instance's hue offset, saturation and value (official: FPS views differ in
    # colour); shared: every view takes view 0's colour of the instance, so a pair differs in colour only by
    # the image-level jitter (an experiment of issue 38: docs/pretraining.md)
    colours: str = "own"

    @classmethod
    def preset(cls, size: int, look: str = "paper", **overrides) -> RenderConfig:
        """The paper's setting for a given output size: 32 px (CIFAR) or >= 64 px (224 px recipe).

        ``look="paper"`` (the default) follows the official generator (andytu28/FPS_Pre-training,
        ``SelfSupGenerator`` as ``main_simsiam.py`` calls it at 32 px): each instance rendered on the full
        canvas, with a random binary 3x3 patch stamped at every point, coloured (hue = count / max count
        + an offset) and then resized bilinearly to its placed size, and a 3x3 view blur with sigma
        ~ U(0.5, 2) at p = 0.5. ``look="sparse"`` is this project's first renderer: instances rendered at
        their placed size without patches, coloured after the resize, blur sigma ~ U(0.1, 1) (U(0.1, 2)
        above 32 px) with a kernel of radius ceil(2 sigma); its views are sparser, more speckled and
        brighter (``fractals stats``)."""
        if size < 16:
            raise ValueError(f"size must be at least 16 px, got {size}")
        if look not in LOOKS:
            raise ValueError(f"look must be one of {', '.join(LOOKS)}, got {look!r}")
        base = cls(size=size)
        if size > 32:  # Appendix A.1.2, 224 px: 100K points rendered at 112^2, I ~ U{2..5}
            base = cls(size=size, points=100_000, codes_per_image=(2, 5))
        if look == "sparse":
            base = cls(**{**asdict(base), "patch_p": 0.0, "blur_radius": 0, "render_full": False,
                          "colour_first": False, "blur_sigma": (0.1, 1.0) if size <= 32 else (0.1, 2.0),
                          **SPARSE_RESIDUALS})
        return cls(**{**asdict(base), **overrides})

    def __post_init__(self) -> None:
        lo, hi = self.codes_per_image
        checks = {
            "size must be >= 16": self.size >= 16,
            "points must be positive": self.points > 0,
            "render_cap must be >= 8": self.render_cap >= 8,
            "codes_per_image must satisfy 1 <= lo <= hi": 1 <= lo <= hi,
            "scale must satisfy 0 < lo <= hi": 0 < self.scale[0] <= self.scale[1],
            "off_canvas must lie in [0, 0.5)": 0 <= self.off_canvas < 0.5,
            "probabilities must lie in [0, 1]": 0 <= self.patch_p <= 1 and 0 <= self.blur_p <= 1,
            "blur_radius must be >= 0": self.blur_radius >= 0,
            f"instances must be one of {', '.join(INSTANCES)}": self.instances in INSTANCES,
            f"colours must be one of {', '.join(COLOURS)}": self.colours in COLOURS,
            f"fit must be one of {', '.join(FITS)}": self.fit in FITS,
            f"hsv must be one of {', '.join(HSVS)}": self.hsv in HSVS,
            "colouring after the resize (colour_first off) takes hsv float without overwrite":
                self.colour_first or (self.hsv == "float" and not self.overwrite),
            "jitter_tries must be >= 0": self.jitter_tries >= 0,
            "burn_in must be >= 0": self.burn_in >= 0,
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(f"RenderConfig: {message} ({self})")

    @property
    def points_per_instance(self) -> int:
        """Points actually drawn: the chains advance together, so this rounds up to a multiple of CHAINS."""
        return CHAINS * math.ceil(self.points / CHAINS)


_KernelParams = namedtuple(
    "_KernelParams",
    "n_steps render_cap scale_lo scale_hi off_canvas jit_lo jit_hi jit_tries jit_translation stretch "
    "patch_centre sat_lo sat_hi val_lo val_hi flips patch_p blur_p blur_lo blur_hi blur_radius render_full "
    "colour_first opencv overwrite floor_placement shared burn_in shared_colour",
)


def _kernel_params(cfg: RenderConfig) -> _KernelParams:
    return _KernelParams(
        cfg.points_per_instance // CHAINS, min(cfg.render_cap, cfg.size), *map(float, cfg.scale),
        float(cfg.off_canvas), *map(float, cfg.jitter), cfg.jitter_tries, cfg.jitter_translation,
        cfg.fit == "stretch", cfg.patch_centre, *map(float, cfg.saturation), *map(float, cfg.value),
        cfg.flips, float(cfg.patch_p), float(cfg.blur_p), *map(float, cfg.blur_sigma), cfg.blur_radius,
        cfg.render_full, cfg.colour_first, cfg.hsv == "opencv", cfg.overwrite, cfg.floor_placement,
        cfg.instances == "shared", cfg.burn_in, cfg.colours == "shared",
    )


def render_batch(bank: CodeBank, cfg: RenderConfig, code_ids: np.ndarray, counts: np.ndarray,
                 seeds: np.ndarray, n_views: int, grey: np.ndarray | None = None) -> np.ndarray:
    """Render B scenes (codes ``code_ids[b, :counts[b]]`` of ``bank``) as uint8 (n_views, B, S, S, 3).

    ``grey``: optional float32 (n_views, B, I, R, R), R = min(S, render_cap), filled with the grade each view
    placed per code before colour, flips and resizing (see :func:`render_scenes`; for tests)."""
    code_ids = np.ascontiguousarray(code_ids, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if code_ids.ndim != 2 or counts.shape != (len(code_ids),) or counts.max(initial=0) > code_ids.shape[1]:
        raise ValueError("code_ids must be (B, I) and counts (B,) with counts <= I")
    out = np.empty((n_views, len(code_ids), cfg.size, cfg.size, 3), np.uint8)
    if grey is None:
        grey = np.empty((0, 0, 0, 0, 0), np.float32)
    render_scenes(bank.maps, bank.n_maps, code_ids, counts, np.asarray(seeds, np.uint64),
                  _kernel_params(cfg), out, grey)
    return out


def _draw_counts(cfg: RenderConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    lo, hi = cfg.codes_per_image
    return rng.integers(lo, hi + 1, n)


def _distinct_codes(n_codes: int, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Codes (B, I), distinct across the whole batch when the bank is large enough, else within rows."""
    b, i = shape
    if b * i <= n_codes:
        return rng.choice(n_codes, b * i, replace=False).reshape(b, i)
    if i > n_codes:
        raise ValueError(f"{i} distinct codes per image requested from a bank of {n_codes}")
    return np.stack([rng.choice(n_codes, i, replace=False) for _ in range(b)])


def _seeds(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, np.iinfo(np.int64).max, n, dtype=np.int64).astype(np.uint64)


def fps_pairs(bank: CodeBank, cfg: RenderConfig, n: int, rng: np.random.Generator, rows: slice = ALL,
              render: Callable = render_batch):
    """n FPS pairs: uint8 views (2, n, S, S, 3), code ids (n, I_max) with -1 padding, counts (n,).

    With ``rows``, all n pairs are drawn but only those rows are rendered and returned: the same pairs,
    bit for bit, as the rows of the full batch (each scene renders from its own seed). ``render``: the
    renderer, :func:`render_batch` (numba) or one with its contract
    (:func:`fractals.torch_render.render_batch` with its device bound: the views are a tensor there)."""
    counts = _draw_counts(cfg, n, rng)
    codes = _distinct_codes(len(bank), (n, cfg.codes_per_image[1]), rng)
    seeds = _seeds(n, rng)
    codes, counts = codes[rows], counts[rows]
    views = render(bank, cfg, codes, counts, seeds[rows], n_views=2)
    return views, np.where(np.arange(codes.shape[1]) < counts[:, None], codes, -1), counts


def multilabel_images(bank: CodeBank, cfg: RenderConfig, n: int, rng: np.random.Generator,
                      n_classes: int = 1000, rows: slice = ALL, render: Callable = render_batch):
    """n multi-label images (1, n, S, S, 3) over classes = the first ``n_classes`` codes, multi-hot float32
    labels (n, n_classes) (Anderson & Farrell 2022, J = 1,000) and the code ids (n, I_max), -1 padded;
    ``rows`` and ``render`` as :func:`fps_pairs`."""
    if not cfg.codes_per_image[1] <= n_classes <= len(bank):
        raise ValueError(f"n_classes must lie in [{cfg.codes_per_image[1]}, {len(bank)}], got {n_classes}")
    counts = _draw_counts(cfg, n, rng)
    codes = np.stack([rng.choice(n_classes, cfg.codes_per_image[1], replace=False) for _ in range(n)])
    seeds = _seeds(n, rng)
    codes, counts = codes[rows], counts[rows]
    images = render(bank, cfg, codes, counts, seeds[rows], n_views=1)
    labels = np.zeros((len(codes), n_classes), np.float32)
    present = np.arange(codes.shape[1]) < counts[:, None]
    labels[np.nonzero(present)[0], codes[present]] = 1.0
    return images, labels, np.where(present, codes, -1)


def single_images(bank: CodeBank, cfg: RenderConfig, n: int, rng: np.random.Generator, rows: slice = ALL,
                  render: Callable = render_batch):
    """n single-fractal images (1, n, S, S, 3), each one code filling the view, and their code ids (n,);
    ``rows`` and ``render`` as :func:`fps_pairs`.

    Both SimSiam views of such an image come from image-level augmentation ("fractal + SimSiam", Table 6).
    """
    cfg = RenderConfig(**{**asdict(cfg), "codes_per_image": (1, 1), "scale": (1.0, 1.0), "off_canvas": 0.0})
    codes = rng.integers(0, len(bank), (n, 1))
    seeds = _seeds(n, rng)
    codes = codes[rows]
    images = render(bank, cfg, codes, np.ones(len(codes), np.int64), seeds[rows], n_views=1)
    return images, codes[:, 0]


@dataclass(frozen=True)
class SceneKind:
    """One kind of pre-training sample (paper Fig. 2c and the Table 6 baselines).

    make(bank, cfg, n, rng, n_classes, rows, render) returns uint8 images (V, n, S, S, 3), code ids (n, I)
    padded with -1, and multi-hot labels (n, n_classes) or None; given ``rows`` (a slice of range(n)), only
    those rows, equal to the same rows of the full batch (a rank's share of a global batch,
    :mod:`fractals.stream`); ``render`` as :func:`fps_pairs` (default numba's :func:`render_batch`).
    ``views`` is how many views image-level augmentation makes: view v augments rendered view v mod V, so a
    single-fractal image is augmented twice.
    """

    make: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray | None]]
    views: int


def _make_fps(bank, cfg, n, rng, n_classes, rows=ALL, render=render_batch):
    views, codes, _ = fps_pairs(bank, cfg, n, rng, rows, render)
    return views, codes, None


def _make_multilabel(bank, cfg, n, rng, n_classes, rows=ALL, render=render_batch):
    images, labels, codes = multilabel_images(bank, cfg, n, rng, n_classes, rows, render)
    return images, codes, labels


def _make_single(bank, cfg, n, rng, n_classes, rows=ALL, render=render_batch):
    images, codes = single_images(bank, cfg, n, rng, rows, render)
    return images, codes[:, None], None


SCENE_KINDS = {
    "fps": SceneKind(_make_fps, views=2),
    "multilabel": SceneKind(_make_multilabel, views=1),
    "single": SceneKind(_make_single, views=2),
}
