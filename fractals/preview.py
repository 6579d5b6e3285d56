"""Preview grids: what the renderer makes, as one PNG (compare with Chen et al., ICLR 2023, Fig. 10)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fpsfl.base.files import atomic_write
from fpsfl.base.images import AugmentConfig

from .ifs import CodeBank
from .scenes import SCENE_KINDS, RenderConfig
from .stream import augment_views

CELLS_PER_ROW = 4
GAP = 6  # px between cells
VIEW_GAP = 2  # px between the two views of a pair
BACKGROUND = 96  # grey, so black fractal backgrounds stay visible


def zoom_for(size: int) -> int:
    """Integer upscaling so small renders are visible: 32 px -> 4x (128 px), >= 128 px -> 1x."""
    return max(1, 128 // size)


def grid_shape(n: int, size: int, views: int) -> tuple[int, int]:
    """(height, width) in px of the grid of n cells, each holding ``views`` images of side ``size``."""
    side = size * zoom_for(size)
    cell_w = views * side + (views - 1) * VIEW_GAP
    cols, rows = min(n, CELLS_PER_ROW), math.ceil(n / CELLS_PER_ROW)
    return rows * side + (rows + 1) * GAP, cols * cell_w + (cols + 1) * GAP


def _denormalise(views: torch.Tensor, cfg: AugmentConfig) -> np.ndarray:
    """Augmented float (..., 3, S, S) back to uint8 (..., S, S, 3) for display."""
    mean = torch.tensor(cfg.mean).view(3, 1, 1)
    std = torch.tensor(cfg.std).view(3, 1, 1)
    img = (views * std + mean).clamp(0, 1).mul(255).round().to(torch.uint8)
    return img.movedim(-3, -1).numpy()


def make_cells(kind: str, bank: CodeBank, cfg: RenderConfig, n: int, seed: int, augs: bool,
               aug_cfg: AugmentConfig | None = None) -> np.ndarray:
    """Images to show, uint8 (V, n, S, S, 3): FPS pairs, single-fractal images as two augmented views,
    or multi-label images. With ``augs`` the image-level augmentation (``aug_cfg``; default: the official
    views') is applied to each view."""
    scene = SCENE_KINDS[kind]
    images = scene.make(bank, cfg, n, np.random.default_rng(seed), min(1000, len(bank)))[0]
    if augs or len(images) < scene.views:  # views that exist only through augmentation are always shown so
        aug_cfg = aug_cfg or AugmentConfig()
        gen = torch.Generator().manual_seed(seed)
        images = _denormalise(augment_views(torch.from_numpy(images), scene.views, aug_cfg, gen), aug_cfg)
    return images


def write_grid(images: np.ndarray, path: str | Path) -> tuple[int, int]:
    """Lay out (V, n, S, S, 3) as n cells of V views side by side and save a PNG; returns (height, width)."""
    views, n, size = images.shape[0], images.shape[1], images.shape[2]
    z = zoom_for(size)
    side = size * z
    height, width = grid_shape(n, size, views)
    grid = np.full((height, width, 3), BACKGROUND, np.uint8)
    cell_w = views * side + (views - 1) * VIEW_GAP
    for i in range(n):
        top = GAP + (i // CELLS_PER_ROW) * (side + GAP)
        left = GAP + (i % CELLS_PER_ROW) * (cell_w + GAP)
        for v in range(views):
            x = left + v * (side + VIEW_GAP)
            grid[top: top + side, x: x + side] = images[v, i].repeat(z, 0).repeat(z, 1)
    atomic_write(path, lambda tmp: Image.fromarray(grid).save(tmp, format="PNG"))
    return height, width
