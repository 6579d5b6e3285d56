"""Random natural-like backgrounds behind fractal views: an experiment of issue 38 (docs/pretraining.md).

Every FPS view is drawn on a black canvas (about 65% of a 32 px view's pixels are exactly 0), and no natural
image has one. The hypothesis: a backbone pre-trained on fractals never had to ignore a background, so on
natural images the background's response fills its features, which a kNN probe cannot look past. Ryali et
al. (2021, "Characterizing and improving the robustness of self-supervised learning through background
augmentations") swap backgrounds between views for MoCo-v2 and BYOL. Here each view of a pair may get its
own background (probability ``background_p``), so the pair shares only its fractals.

A background is coloured noise whose amplitude spectrum falls as 1/f^s, s ~ U(1, 2) per view: natural
images' spectra fall as about 1/f (Field 1987), and noise of that kind is itself a usable pre-training
source (Baradad et al., NeurIPS 2021, "Learning to see by looking at noise"). One luminance field shared by
the channels plus one field per channel (correlation 0.8 between channels), a mean level per channel ~ U(0.1,
0.9) and a contrast (std) per channel ~ U(0.05, 0.3), clipped to [0, 1]. The render is read as colour
premultiplied by its coverage (a fractal drawn over black): the background shows through by 1 - alpha, with
alpha the pixel's brightest channel over :data:`OPAQUE` of full scale.

Pure functions of tensors and their draws: no host sync, static shapes (``pretrain --cuda-graph`` captures
them with the rest of the views).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .syncs import to_device

SLOPE = (1.0, 2.0)  # amplitude spectrum ~ 1/f^s, s uniform (natural images: about 1, Field 1987)
LEVEL = (0.1, 0.9)  # per-channel mean of the background, fraction of full scale, uniform
CONTRAST = (0.05, 0.3)  # per-channel std of the background, fraction of full scale, uniform
SHARED = 2.0  # weight of the luminance field against each channel's own (1): correlation 4 / 5 = 0.8
# a pixel whose brightest channel reaches this fraction of full scale hides the background: the fractals'
# HSV value is at least 0.5 (fractals.scenes.RenderConfig.value), so every unblurred fractal pixel does
OPAQUE = 0.5
N_UNIFORM = 7  # uniforms per view: the slope, three levels, three contrasts


class BackgroundDraws(NamedTuple):
    on: Tensor  # (B,) bool: the views that get a background
    noise: Tensor  # (B, 4, H, W) standard normal: the luminance field's and each channel's white noise
    u: Tensor  # (B, 7) uniforms: slope, levels (3), contrasts (3)


def none_drawn(device: torch.device | str) -> BackgroundDraws:
    """No background: empty tensors (nothing drawn from the generator, so its stream is that of views
    without backgrounds)."""
    empty = torch.zeros(0, device=device)
    return BackgroundDraws(empty.bool(), empty, empty)


def draw_background(p: float, n: int, h: int, w: int, generator: torch.Generator,
                    device: torch.device | str, rows: slice) -> BackgroundDraws:
    """The background draws of n views of h x w px (probability ``p`` each), the ``rows`` kept; drawn after
    every other draw of the views, so a stream without backgrounds is unchanged."""
    on = torch.rand(n, generator=generator, device=generator.device) < p
    noise = torch.randn(n, 4, h, w, generator=generator, device=generator.device)
    u = torch.rand(n, N_UNIFORM, generator=generator, device=generator.device)
    return BackgroundDraws(*(to_device(t, device)[rows] for t in (on, noise, u)))


def spectral_noise(white: Tensor, slope: Tensor) -> Tensor:
    """white (B, C, H, W) noise -> fields of the same shape whose amplitude spectrum falls as f^-slope
    (slope (B,), f in cycles per pixel, the zero frequency removed), each map scaled to mean 0, std 1."""
    b, _, h, w = white.shape
    fy = torch.fft.fftfreq(h, device=white.device, dtype=white.dtype)
    fx = torch.fft.rfftfreq(w, device=white.device, dtype=white.dtype)
    f = torch.sqrt(fy[:, None] ** 2 + fx[None, :] ** 2)
    lowest = 1.0 / max(h, w)
    gain = f.clamp_min(lowest)[None, None] ** -slope.view(b, 1, 1, 1)
    gain = gain * (f > 0)  # no zero frequency: each map's mean is set below
    field = torch.fft.irfft2(torch.fft.rfft2(white) * gain, s=(h, w))
    field = field - field.mean((2, 3), keepdim=True)
    return field / field.std((2, 3), keepdim=True).clamp_min(1e-6)


def background(d_noise: Tensor, d_u: Tensor) -> Tensor:
    """Backgrounds (B, 3, H, W) in [0, 1] from their draws (noise (B, 4, H, W), uniforms (B, 7))."""
    slope = SLOPE[0] + (SLOPE[1] - SLOPE[0]) * d_u[:, 0]
    fields = spectral_noise(d_noise, slope)
    mixed = (SHARED * fields[:, :1] + fields[:, 1:]) / math.sqrt(SHARED ** 2 + 1)  # unit std per channel
    level = (LEVEL[0] + (LEVEL[1] - LEVEL[0]) * d_u[:, 1:4])[:, :, None, None]
    contrast = (CONTRAST[0] + (CONTRAST[1] - CONTRAST[0]) * d_u[:, 4:7])[:, :, None, None]
    return (level + contrast * mixed).clamp(0, 1)


def composite(x: Tensor, bg: Tensor, peak: float) -> Tensor:
    """Renders x (B, 3, H, W) in [0, peak], colour premultiplied by coverage, over backgrounds bg in
    [0, 1]: x + (1 - alpha) bg peak, alpha = min(1, brightest channel / (OPAQUE peak))."""
    alpha = (x.amax(1, keepdim=True) / (OPAQUE * peak)).clamp(max=1)
    return (x + (1 - alpha) * bg * peak).clamp(max=peak)
