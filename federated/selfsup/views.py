"""Augmented views for federated self-supervised learning, batched on the training device.

The image ops are those of pre-training (:func:`fpsfl.base.images.augment`); this module adds the two that
Orchestra's views need beyond them (Lubana et al., ICML 2022; official ``utils.OrchestraTransform``):
solarisation (BYOL's second view) and the rotation by a multiple of 90 degrees whose angle the degeneracy
regulariser predicts (Gidaris et al. 2018). Inputs are a client's uint8 images (B, S, S, 3); outputs float32
(B, 3, out, out) normalised with the ImageNet statistics, as every other stage of fpsfl sees them. All
randomness comes from one generator in a fixed order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpsfl.base.images import AugmentConfig, augment

from ..tasks.transforms import add_noise

SOLARIZE_THRESHOLD = 128 / 255  # PIL's ImageOps.solarize default: pixels >= 128 are inverted


def solarize(x: Tensor, p: float, generator: torch.Generator, mean: tuple[float, ...],
             std: tuple[float, ...]) -> Tensor:
    """Invert the pixels at or above :data:`SOLARIZE_THRESHOLD` of each image with probability ``p``; x is a
    batch normalised with (mean, std), and so is the result."""
    on = torch.rand(x.shape[0], generator=generator, device=generator.device).to(x.device) < p
    m, s = x.new_tensor(mean).view(1, 3, 1, 1), x.new_tensor(std).view(1, 3, 1, 1)
    pixels = x * s + m  # [0, 1]
    flipped = torch.where(pixels >= SOLARIZE_THRESHOLD, 1 - pixels, pixels)
    return torch.where(on.view(-1, 1, 1, 1), (flipped - m) / s, x)


def rotations(b: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """Uniform quarter turns (B,) in {0, 1, 2, 3} (the official RotTransform's four equally likely angles)."""
    return torch.randint(0, 4, (b,), generator=generator, device=generator.device).to(device)


def rotate(x: Tensor, quarter_turns: Tensor) -> Tensor:
    """Rotate each image of x (B, C, H, W), H = W, counter-clockwise by quarter_turns (B,) x 90 degrees (as
    torchvision's ``TF.rotate(img, 90 * k)``)."""
    out = x.clone()
    for k in range(1, 4):
        idx = (quarter_turns == k).nonzero().squeeze(1)
        if idx.numel():
            out[idx] = torch.rot90(x[idx], k, dims=(2, 3))
    return out


def views(images: Tensor, cfgs: tuple[AugmentConfig, ...], generator: torch.Generator, size: int,
          solarize_p: tuple[float, ...] | None = None, noise: float = 0.0) -> list[Tensor]:
    """One augmented view per config, each followed by solarisation with probability ``solarize_p[i]`` and
    by the client's Gaussian noise of ``noise`` sigma (the noise partition's feature skew, as supervised
    federate adds it)."""
    out = []
    for i, cfg in enumerate(cfgs):
        v = augment(images, cfg, generator, out_size=size)
        if solarize_p is not None and solarize_p[i] > 0:
            v = solarize(v, solarize_p[i], generator, cfg.mean, cfg.std)
        if noise > 0:
            v = add_noise(v, noise, generator, cfg.std)
        out.append(v.contiguous(memory_format=torch.channels_last))
    return out
