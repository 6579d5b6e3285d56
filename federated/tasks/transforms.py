"""Training and evaluation transforms for federated fine-tuning, as batched tensor ops on any device.

Chen et al., ICLR 2023, §4.2 and Appendix B.1 fine-tune with the standard recipes: at 32 px (CIFAR) "images
are padded 2 pixels on each side, randomly flipped horizontally, and then randomly cropped back to 32 x 32"
(B.1; He et al.'s CIFAR recipe pads 4); at larger sizes (Tiny-ImageNet at 64 px, iNat at 224 px) a
random-resized crop plus flip "following the official PyTorch ImageNet training script" (torchvision's
RandomResizedCrop defaults). Images are normalised
with the ImageNet statistics that pre-training used (:mod:`fpsfl.base.images`).

Images arrive as the datasets hold them, uint8 (B, S, S, 3) channels-last; outputs are float32
(B, 3, input, input), normalised. All randomness comes from one ``torch.Generator`` in a fixed order, so a
seed fixes the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fpsfl.base.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    channel_constant,
    normalise,
    resized_crop,
    sample_crop_boxes,
)
from fpsfl.base.images import check_images as _check
from fpsfl.base.syncs import to_device

PAD_CROP_MAX_SIDE = 32  # px: images this small that are trained at their stored side get pad-and-crop


@dataclass(frozen=True)
class TrainAugment:
    input_size: int  # px, output side
    pad: int = 2  # px, the pad-and-crop at 32 px (Appendix B.1: 2 px on each side)
    crop_scale: tuple[float, float] = (0.08, 1.0)  # crop area / image area at larger sizes (torchvision)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop width / height, log-uniform (torchvision)
    flip_p: float = 0.5  # probability of a horizontal flip
    mean: tuple[float, float, float] = IMAGENET_MEAN  # the statistics pre-training normalised with
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        checks = {
            "input_size must be positive": self.input_size > 0,
            "pad must be >= 0": self.pad >= 0,
            "crop_scale must satisfy 0 < lo <= hi <= 1": 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1,
            "crop_ratio must satisfy 0 < lo <= hi": 0 < self.crop_ratio[0] <= self.crop_ratio[1],
            "flip_p must lie in [0, 1]": 0 <= self.flip_p <= 1,
            "std must be positive": min(self.std) > 0,
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(f"TrainAugment: {message} ({self})")


def uses_pad_crop(stored: int, input_size: int) -> bool:
    """Pad-and-crop when images are trained at their stored side and that is at most 32 px; otherwise a
    random-resized crop (which also rescales, e.g. 64 px stored -> 224 px input)."""
    return stored == input_size <= PAD_CROP_MAX_SIDE


def pad_crop(x: Tensor, pad: int, offsets: Tensor, flip: Tensor) -> Tensor:
    """uint8 (B, S, S, 3) -> uint8 (B, S, S, 3): zero-pad ``pad`` px on every side, crop S x S at
    offsets (B, 2) = (x0, y0) in the padded image (0..2 pad; pad, pad is the original), mirror where flip.

    One gather: output pixel (i, j) of sample b is padded[b, y0 + i, x0 + j'] with j' = S - 1 - j if flipped.
    """
    b, s = x.shape[0], x.shape[1]
    padded = F.pad(x, (0, 0, pad, pad, pad, pad))  # (B, S + 2 pad, S + 2 pad, 3), zeros = black
    ar = torch.arange(s, device=x.device)
    offsets, flip = to_device(offsets, x.device), to_device(flip, x.device)
    rows = offsets[:, 1:2] + ar  # (B, S)
    cols = offsets[:, 0:1] + torch.where(flip[:, None], s - 1 - ar, ar)  # (B, S)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded[batch, rows[:, :, None], cols[:, None, :]]  # (B, S, S, 3)


def augment_batch(x: Tensor, aug: TrainAugment, generator: torch.Generator) -> Tensor:
    """uint8 (B, S, S, 3) -> float32 (B, 3, input, input), normalised: pad-crop + flip when
    :func:`uses_pad_crop`, else random-resized crop to ``aug.input_size`` + flip (bilinear, no antialias)."""
    _check(x)
    b, s, dev = x.shape[0], x.shape[1], x.device
    if uses_pad_crop(s, aug.input_size):
        offsets = torch.randint(0, 2 * aug.pad + 1, (b, 2), generator=generator, device=generator.device)
        flip = torch.rand(b, generator=generator, device=generator.device) < aug.flip_p
        out = pad_crop(x, aug.pad, offsets, flip).permute(0, 3, 1, 2).float()
    else:
        boxes = sample_crop_boxes(b, s, s, aug.crop_scale, aug.crop_ratio, generator, dev)
        flip = to_device(torch.rand(b, generator=generator, device=generator.device) < aug.flip_p, dev)
        out = resized_crop(x.permute(0, 3, 1, 2).float(), boxes, aug.input_size, flip)
    return normalise(out, aug.mean, aug.std)


def add_noise(x: Tensor, sigma: float, generator: torch.Generator,
              std: tuple[float, ...] = IMAGENET_STD) -> Tensor:
    """A normalised batch (B, 3, H, W) with Gaussian noise of ``sigma`` in [0, 1] pixel units added.

    Normalisation maps a pixel p to (p - mean_c) / std_c, so noise e ~ N(0, sigma^2) added to p before it
    becomes e / std_c after: this returns x + e / std_c, i.e. exactly the normalised image of p + e, with no
    clamping to [0, 1]. ``std`` must be the statistics the batch was normalised with.
    """
    noise = torch.randn(x.shape, generator=generator, device=generator.device).to(x)
    return x + noise * (sigma / channel_constant(std, x.device, x.dtype))
