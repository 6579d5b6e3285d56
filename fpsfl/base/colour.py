"""The colour ops of the MoCo-v2 / SimSiam augmentation (ColorJitter, grayscale) as batched tensor ops, each
matching torchvision's per-image definition (tests/fpsfl/test_images.py); :mod:`fpsfl.base.images` runs them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .syncs import channel_constant, to_device

LUMA = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma weights, rounded as torchvision's tensor rgb_to_grayscale
_HUE_OFFSETS = (5.0, 3.0, 1.0)  # sextant offsets of R, G, B in the HSV -> RGB formula


def _col(v: Tensor, x: Tensor) -> Tensor:
    """A per-sample parameter (B,) as (B, 1, 1, 1) in x's dtype and device, to broadcast over images."""
    return to_device(v, x.device).to(x.dtype).view(-1, 1, 1, 1)


def _luma(x: Tensor) -> Tensor:
    """(B, 3, H, W) -> (B, 1, H, W) grayscale; accumulated in place to allocate one plane, not three."""
    r, g, b = x.unbind(1)
    return (r * LUMA[0]).add_(g, alpha=LUMA[1]).add_(b, alpha=LUMA[2]).unsqueeze(1)


def to_grayscale(x: Tensor) -> Tensor:
    """torchvision's rgb_to_grayscale(num_output_channels=3): (B, 3, H, W) -> expanded (B, 3, H, W) view."""
    return _luma(x).expand_as(x)


# The colour ops come in pairs: an in-place kernel (trailing underscore) that augment() runs on its own
# buffer, because at 32 px a fresh batch-sized allocation costs more than the arithmetic, and a pure wrapper.


def _brightness_(x: Tensor, f: Tensor) -> Tensor:
    return x.mul_(_col(f, x)).clamp_(0, 1)


def _contrast_(x: Tensor, f: Tensor) -> Tensor:
    mean = _luma(x.mean((2, 3), keepdim=True))  # the mean of the grayscale image is the luma of channel means
    f = _col(f, x)
    return x.mul_(f).add_(mean * (1 - f)).clamp_(0, 1)


def _saturation_(x: Tensor, f: Tensor) -> Tensor:
    return x.lerp_(_luma(x), 1 - _col(f, x)).clamp_(0, 1)  # x + (1 - f)(gray - x)


def _hue_(x: Tensor, h: Tensor) -> Tensor:
    # Straight through hue and chroma: an RGB -> HSV -> RGB round trip would divide by v and multiply back.
    h6, c, v = _hue_chroma(x)
    return _from_hue_chroma(h6.add_(_col(h, x), alpha=6), c, v, out=x)


def adjust_brightness(x: Tensor, f: Tensor) -> Tensor:
    """Scale intensities by f (B,), clipped to [0, 1] (torchvision: a blend with black)."""
    return _brightness_(x.clone(), f)


def adjust_contrast(x: Tensor, f: Tensor) -> Tensor:
    """Blend with the image's mean grayscale intensity: f x + (1 - f) mean, clipped (torchvision)."""
    return _contrast_(x.clone(), f)


def adjust_saturation(x: Tensor, f: Tensor) -> Tensor:
    """Blend with the grayscale image: f x + (1 - f) gray, clipped (torchvision)."""
    return _saturation_(x.clone(), f)


def adjust_hue(x: Tensor, h: Tensor) -> Tensor:
    """Rotate the HSV hue by h (B,) turns, h in [-0.5, 0.5] (torchvision)."""
    return _hue_(x.clone(), h)


def _hue_chroma(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, 3, H, W) RGB -> hue in sextants [-1, 5), chroma (max - min) and value (max), each (B, 1, H, W).

    Hue = (g - b) / c if red is the max, 2 + (b - r) / c if green is, 4 + (r - g) / c if blue is (red wins
    ties, then green, as torchvision). The branches are blended with 0/1 float masks by lerp, which is exact
    at weights 0 and 1: comparisons into bool and torch.where are several times slower on CPU than into
    float. All planes share one allocation, since fresh memory costs more than the arithmetic here.
    """
    b_, _, hgt, wid = x.shape
    h, c, v, mask, tmp = x.new_empty((5, b_, 1, hgt, wid)).unbind(0)
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    torch.amax(x, 1, keepdim=True, out=v)
    torch.amin(x, 1, keepdim=True, out=c).neg_().add_(v)
    torch.sub(r, g, out=h).add_(c, alpha=4)  # hue * c where blue is the max
    h.lerp_(torch.sub(b, r, out=tmp).add_(c, alpha=2), torch.eq(v, g, out=mask))  # green
    h.lerp_(torch.sub(g, b, out=tmp), torch.eq(v, r, out=mask))  # red
    return h.div_(torch.clamp_min(c, 1e-12, out=tmp)), c, v  # grey pixels (c = 0) get hue 0


def _from_hue_chroma(h6: Tensor, c: Tensor, v: Tensor, out: Tensor) -> Tensor:
    """Inverse of :func:`_hue_chroma`, written into ``out`` (B, 3, H, W); h6 may lie anywhere in [-8, 12].

    Channel n = v - c t(k) with k = h6 + (5, 3, 1)_n and t(k) = clamp(2 - d, 0, 1), d the distance from k to
    the nearest of 2 + 6 Z. Folding with abs gives d without a slow remainder: d = ||k - 5| - 6| - 3| for
    k in [-7, 17].
    """
    k = torch.add(h6, channel_constant(_HUE_OFFSETS, h6.device, h6.dtype), out=out)
    t = k.sub_(5).abs_().sub_(6).abs_().sub_(3).abs_().neg_().add_(2).clamp_(0, 1)
    return t.mul_(c).neg_().add_(v)


def rgb_to_hsv(x: Tensor) -> Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> HSV with every channel in [0, 1] (hue as a fraction of a turn)."""
    h6, c, v = _hue_chroma(x)
    h = h6.div_(6)
    return torch.cat((h - h.floor(), c / v.clamp_min(1e-12), v), 1)


def hsv_to_rgb(hsv: Tensor) -> Tensor:
    """Inverse of :func:`rgb_to_hsv`."""
    h, s, v = hsv[:, 0:1], hsv[:, 1:2], hsv[:, 2:3]
    return _from_hue_chroma(h * 6, s * v, v, out=torch.empty_like(hsv))
