"""Image-level augmentations of the MoCo-v2 / SimSiam recipe as batched tensor ops, on any device.

Chen et al., ICLR 2023, Appendix A: fractal pre-training applies the MoCo-v2 augmentations (Chen et al. 2020;
SimSiam, Chen & He 2021) to every view: RandomResizedCrop with scale (0.2, 1), ColorJitter(0.4, 0.4, 0.4,
0.1) with p = 0.8, grayscale with p = 0.2, Gaussian blur with p = 0.5, horizontal flip with p = 0.5, then
normalisation with the ImageNet statistics.

torchvision applies these per image; here each op is a function of a (B, 3, H, W) float batch and per-sample
parameter tensors, so a batch costs a few tensor ops on whatever device it lives on (512 images of 32 px:
~15-30 ms on one CPU thread). Each op matches torchvision's per-image definition (tests/test_augment.py checks
them against torchvision). Deliberate differences: ColorJitter's random order of its four ops is drawn once
per batch, not per image; the crop is bilinear without antialiasing (torchvision's antialias=False, which
is moot when the crop is upsampled, as at 32 px); the flip is folded into the crop, which is exact because
blur and colour ops commute with a horizontal flip.

All randomness comes from one ``torch.Generator``, drawn in a fixed order whatever the probabilities, so a
seed fixes the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .backgrounds import BackgroundDraws, background, composite, draw_background, none_drawn
from .colour import (  # noqa: F401 (the colour ops are part of this module's interface)
    LUMA,
    _brightness_,
    _col,
    _contrast_,
    _hue_,
    _saturation_,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    hsv_to_rgb,
    rgb_to_hsv,
    to_grayscale,
)
from .syncs import channel_constant, device_constant, to_device

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the ImageNet statistics every input is normalised with
IMAGENET_STD = (0.229, 0.224, 0.225)
_CROP_ATTEMPTS = 10  # candidate boxes per sample before the central fallback, as torchvision


@dataclass(frozen=True)
class AugmentConfig:
    """MoCo-v2 / SimSiam augmentation parameters (Chen et al., ICLR 2023, Appendix A)."""

    crop_scale: tuple[float, float] = (0.2, 1.0)  # crop area / image area, uniform (MoCo-v2 / SimSiam)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop width / height, log-uniform (torchvision default)
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
    jitter_p: float = 0.8  # probability of colour jitter (MoCo-v2)
    grayscale_p: float = 0.2  # probability of grayscale (MoCo-v2)
    blur_p: float = 0.5  # probability of Gaussian blur (MoCo-v2)
    blur_sigma: tuple[float, float] = (0.1, 2.0)  # px of the output at any size, uniform (MoCo-v2)
    blur_kernel: int | None = None  # px, odd; None: nearest 10% of the side, >= 5 (blur_kernel_size)
    flip_p: float = 0.5  # probability of a horizontal flip
    # probability that a view's black canvas gets a random 1/f noise background (fpsfl.base.backgrounds;
    # 0: MoCo-v2's views, none drawn)
    background_p: float = 0.0
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        probs = (self.jitter_p, self.grayscale_p, self.blur_p, self.flip_p, self.background_p)
        checks = {
            "crop_scale must satisfy 0 < lo <= hi <= 1": 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1,
            "crop_ratio must satisfy 0 < lo <= hi": 0 < self.crop_ratio[0] <= self.crop_ratio[1],
            "jitter strengths must be >= 0, brightness/contrast/saturation <= 1, hue <= 0.5":
                min(self.jitter) >= 0 and max(self.jitter[:3]) <= 1 and self.jitter[3] <= 0.5,
            "probabilities must lie in [0, 1]": all(0 <= p <= 1 for p in probs),
            "blur_sigma must satisfy 0 < lo <= hi": 0 < self.blur_sigma[0] <= self.blur_sigma[1],
            "blur_kernel must be odd and positive":
                self.blur_kernel is None or (self.blur_kernel > 0 and self.blur_kernel % 2 == 1),
            "std must be positive": min(self.std) > 0,
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(f"AugmentConfig: {message} ({self})")


def blur_kernel_size(side: int) -> int:
    """The odd number nearest 10% of ``side`` (SimCLR App. A: 23 px at 224 px), at least 5: the FPS code's
    ``GaussianBlur(5)`` at 32 px (andytu28/FPS_Pre-training, main_simsiam.py / main_moco.py)."""
    return max(5, 2 * math.floor(side / 20) + 1)


def gaussian_blur(x: Tensor, sigma: Tensor, kernel_size: int) -> Tensor:
    """Blur each image with its own sigma (B,) px, reflect padding, as torchvision's gaussian_blur.

    Separable: one grouped conv per axis with the batch folded into channels, so each (image, channel) gets
    its own 1-D kernel. A sigma <= 0 gives a delta kernel, i.e. leaves that image unchanged.
    """
    b, ch, hgt, wid = x.shape
    half = (kernel_size - 1) / 2
    t = torch.linspace(-half, half, kernel_size, dtype=x.dtype, device=x.device)
    s = sigma.to(x).clamp_min(1e-6)[:, None]  # tiny sigma: exp underflows to 0 off-centre, a delta
    k = torch.exp(-0.5 * (t / s) ** 2)
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(ch, 0)  # (B * C, K)
    p = kernel_size // 2
    y = F.pad(x.reshape(1, b * ch, hgt, wid), (p, p, p, p), mode="reflect")
    y = F.conv2d(y, k.view(b * ch, 1, 1, kernel_size), groups=b * ch)  # rows, on the padded height
    y = F.conv2d(y, k.view(b * ch, 1, kernel_size, 1), groups=b * ch)  # columns
    return y.view(b, ch, hgt, wid)


def crop_theta(boxes: Tensor, h: int, w: int, flip: Tensor) -> Tensor:
    """The (B, 2, 3) affine map, in grid_sample's normalised coordinates (align_corners=False), that sends
    the output square onto boxes (B, 4) = (x0, y0, w, h) px of an h x w image; flip (B,) mirrors x."""
    x0, y0, bw, bh = boxes.unbind(1)
    sign = 1 - 2 * flip.to(boxes.dtype)
    zero = torch.zeros_like(x0)
    # Pixel centre p sits at (2 p + 1) / W - 1, so the box spans [2 x0 / W - 1, 2 (x0 + bw) / W - 1].
    return torch.stack((sign * bw / w, zero, (2 * x0 + bw) / w - 1,
                        zero, bh / h, (2 * y0 + bh) / h - 1), 1).view(-1, 2, 3)


def resized_crop(x: Tensor, boxes: Tensor, out_size: int, flip: Tensor) -> Tensor:
    """Crop boxes (B, 4) = (x0, y0, w, h) px from x (B, C, H, W), resize to out_size^2 (bilinear), flip.

    Equals torchvision's crop-then-resize (antialias=False): output pixel j samples the box at
    x0 + (j + 0.5) w / out_size - 0.5, clamped to the box's outermost pixel centres so nothing outside the
    box leaks in. The grid is F.affine_grid(crop_theta(...), align_corners=False), built per axis: theta has
    no rotation, so x depends on the column only and y on the row only, and the (B, S, S, 2) batched matmul
    affine_grid would run (the slowest step at 32 px) reduces to two (B, S) outer products.
    """
    b, _, hgt, wid = x.shape
    boxes = boxes.to(x)
    theta = crop_theta(boxes, hgt, wid, flip)
    base = (torch.arange(out_size, dtype=x.dtype, device=x.device) * 2 + 1) / out_size - 1  # (S,)
    gx = theta[:, 0, 0:1] * base + theta[:, 0, 2:3]  # (B, S)
    gy = theta[:, 1, 1:2] * base + theta[:, 1, 2:3]
    x0, y0, bw, bh = boxes[:, :, None].unbind(1)
    gx = gx.clamp((2 * x0 + 1) / wid - 1, (2 * (x0 + bw) - 1) / wid - 1)
    gy = gy.clamp((2 * y0 + 1) / hgt - 1, (2 * (y0 + bh) - 1) / hgt - 1)
    grid = torch.stack((gx[:, None, :].expand(b, out_size, out_size),
                        gy[:, :, None].expand(b, out_size, out_size)), 3)  # (B, S, S, 2) as (x, y)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _rand(n: int, generator: torch.Generator, device: torch.device | str) -> Tensor:
    """n uniforms in [0, 1) from the generator (on its own device), moved to ``device`` if that differs."""
    u = torch.rand(n, generator=generator, device=generator.device)
    return to_device(u, device)


# Whether augmentation runs in its sync-free form (issue 40): every sample computed and the selection kept
# by torch.where, the jitter order applied without reading it back. None: on accelerators only (on a CPU
# the host form, which computes only the selected samples, is faster and reads cost nothing). Tests set it.
SYNC_FREE: bool | None = None


def _sync_free(x: Tensor) -> bool:
    return x.device.type != "cpu" if SYNC_FREE is None else SYNC_FREE


def sample_crop_boxes(b: int, h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float],
                      generator: torch.Generator, device: torch.device | str) -> Tensor:
    """RandomResizedCrop boxes (B, 4) as (x0, y0, w, h) px with integer values, float32.

    As torchvision: area ~ U(scale) H W and aspect ~ logU(ratio), side lengths rounded; the first of 10
    candidates that fits is kept, else the central crop with the aspect clamped into ``ratio``. All
    candidates are drawn at once, so every sample consumes the same number of draws.
    """
    u = _rand(b * (2 * _CROP_ATTEMPTS + 2), generator, device)
    cand, off = u[: 2 * b * _CROP_ATTEMPTS].view(2, b, _CROP_ATTEMPTS), u[2 * b * _CROP_ATTEMPTS :].view(2, b)
    area = h * w * (scale[0] + (scale[1] - scale[0]) * cand[0])
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lr0 + (lr1 - lr0) * cand[1])
    cw, ch = torch.sqrt(area * aspect).round(), torch.sqrt(area / aspect).round()
    fits = (cw >= 1) & (cw <= w) & (ch >= 1) & (ch <= h)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)  # argmax returns the first maximal index
    ok = fits.any(1)
    fw, fh = w, h  # fallback: the whole image, narrowed to the nearest allowed aspect
    if w / h < ratio[0]:
        fh = round(w / ratio[0])
    elif w / h > ratio[1]:
        fw = round(h * ratio[1])
    bw = torch.where(ok, cw.gather(1, first)[:, 0], float(fw))
    bh = torch.where(ok, ch.gather(1, first)[:, 0], float(fh))
    # Offsets ~ U{0..W - w}; the clamp guards a uniform that rounds up to 1 in float32.
    x0 = torch.where(ok, (off[0] * (w - bw + 1)).floor().clamp_max(w - bw), float((w - fw) // 2))
    y0 = torch.where(ok, (off[1] * (h - bh + 1)).floor().clamp_max(h - bh), float((h - fh) // 2))
    return torch.stack((x0, y0, bw, bh), 1)


def _masked_(x: Tensor, on: Tensor, fn: Callable[[Tensor, Tensor], Tensor], sync_free: bool) -> Tensor:
    """Replace the samples where on (B,) is True by fn(those samples, their indices), in place.

    The others stay bit-identical. On a CPU the work scales with the selection rate; the sync-free form
    (:data:`SYNC_FREE`) runs fn on every sample and keeps the selected results, since finding the indices
    would make the host wait for the device.
    """
    if sync_free:
        every = torch.arange(len(x), device=x.device)
        return x.copy_(torch.where(on.view(-1, 1, 1, 1), fn(x.clone(), every), x))
    idx = on.nonzero().squeeze(1)
    if idx.numel() > 0:
        x.index_copy_(0, idx, fn(x.index_select(0, idx), idx))
    return x


class Draws(NamedTuple):
    """One batch's random draws for :func:`augment`, on the batch's device: with the images, all the
    augmentation depends on. Drawn by :func:`draw` in one fixed order; :func:`apply` is a pure function of
    images and draws (``pretrain --compile`` compiles it)."""

    boxes: Tensor  # (B, 4) crop boxes (x0, y0, w, h) px
    flip: Tensor  # (B,) bool
    jitter_on: Tensor  # (B,) bool
    jitter_u: Tensor  # (4, B) uniforms of the brightness, contrast, saturation and hue factors
    order: Tensor  # (4,) the batch's order of the four jitter ops (torchvision's randperm)
    gray: Tensor  # (B,) bool
    blur: Tensor  # (B,) bool
    sigma: Tensor  # (B,) blur sigma px
    bg_on: Tensor  # (B,) bool, the views with a background; the three bg_ fields are empty without
    bg_noise: Tensor  # (B, 4, H, W) the backgrounds' white noise (fpsfl.base.backgrounds.BackgroundDraws)
    bg_u: Tensor  # (B, 7) the backgrounds' uniforms


def draw(cfg: AugmentConfig, n: int, h: int, w: int, generator: torch.Generator, device: torch.device | str,
         rows: slice | None = None) -> Draws:
    """The draws of a batch of n images of h x w px; ``rows``: the share of them this call augments."""
    rows = slice(0, n) if rows is None else rows
    boxes = sample_crop_boxes(n, h, w, cfg.crop_scale, cfg.crop_ratio, generator, device)[rows]
    flip = (_rand(n, generator, device) < cfg.flip_p)[rows]
    jitter_on = (_rand(n, generator, device) < cfg.jitter_p)[rows]
    jitter_u = _rand(4 * n, generator, device).view(4, n)[:, rows]
    order = to_device(torch.randperm(4, generator=generator, device=generator.device), device)
    gray = (_rand(n, generator, device) < cfg.grayscale_p)[rows]
    blur = (_rand(n, generator, device) < cfg.blur_p)[rows]
    sigma = cfg.blur_sigma[0] + (cfg.blur_sigma[1] - cfg.blur_sigma[0]) * _rand(n, generator, device)[rows]
    # last, and only when asked for: a stream without backgrounds draws what it always drew
    bg = draw_background(cfg.background_p, n, h, w, generator, device, rows) if cfg.background_p > 0 \
        else none_drawn(device)
    return Draws(boxes, flip, jitter_on, jitter_u, order, gray, blur, sigma, *bg)


def _random_jitter_(x: Tensor, cfg: AugmentConfig, d: Draws, sync_free: bool) -> Tensor:
    """ColorJitter on the samples drawn for it (probability jitter_p); one random order of the four ops
    per batch."""
    active = [i for i in range(4) if cfg.jitter[i] > 0]  # a zero strength is skipped, as torchvision does
    s = device_constant(cfg.jitter, d.jitter_u.device, d.jitter_u.dtype)[:, None]
    u = d.jitter_u
    # Factors ~ U(1 - s, 1 + s) for brightness, contrast, saturation; hue shift ~ U(-s, s) (torchvision).
    params = torch.cat((1 - s[:3] + 2 * s[:3] * u[:3], s[3:] * (2 * u[3:] - 1)))  # (4, B)
    kernels = (_brightness_, _contrast_, _saturation_, _hue_)

    if sync_free:  # the order stays on the device: at each of the 4 places, the op drawn for it
        def jitter(xs: Tensor, idx: Tensor) -> Tensor:
            for place in range(4):
                for i in active:
                    xs = torch.where(d.order[place] == i, kernels[i](xs.clone(), params[i, idx]), xs)
            return xs
    else:
        order = [i for i in d.order.tolist() if i in active]

        def jitter(xs: Tensor, idx: Tensor) -> Tensor:
            for i in order:
                xs = kernels[i](xs, params[i, idx])
            return xs

    return _masked_(x, d.jitter_on, jitter, sync_free)


def _image_size(images: Tensor) -> tuple[int, int]:
    """(H, W) of uint8 (B, H, W, 3) channels-last images (as the fractal renderer writes them) or float
    (B, 3, H, W) ones; the layout checked."""
    if images.dtype == torch.uint8:
        if images.ndim != 4 or images.shape[3] != 3:
            raise ValueError(f"uint8 images must be (B, H, W, 3), got {tuple(images.shape)}")
        return images.shape[1], images.shape[2]
    if images.is_floating_point():
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"float images must be (B, 3, H, W), got {tuple(images.shape)}")
        return images.shape[2], images.shape[3]
    raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")


def _as_float(images: Tensor) -> Tensor:
    """The images (checked by :func:`_image_size`) as float32 (B, 3, H, W): uint8 in 0..255, float in
    [0, 1]."""
    _image_size(images)
    if images.dtype == torch.uint8:
        return images.permute(0, 3, 1, 2).float()  # 0..255; the crop is linear, so scale its output instead
    return images.float()


def apply(images: Tensor, d: Draws, cfg: AugmentConfig, out_size: int | None = None,
          sync_free: bool | None = None) -> Tensor:
    """Augment a batch with its draws: the background (when drawn), crop + flip, colour jitter, grayscale,
    blur, normalise. Pure: no generator, and in the sync-free form (default on accelerators,
    :data:`SYNC_FREE`) no read back and fixed shapes, so it compiles to one graph."""
    x = _as_float(images)
    sync_free = _sync_free(x) if sync_free is None else sync_free
    if d.bg_on.numel():  # on the render, before the crop, so every later op treats it as part of the image
        x = _with_background(x, BackgroundDraws(d.bg_on, d.bg_noise, d.bg_u),
                             255.0 if images.dtype == torch.uint8 else 1.0, sync_free)
    size = x.shape[2] if out_size is None else out_size
    x = resized_crop(x, d.boxes, size, d.flip)  # a fresh buffer: everything below may work in place
    if images.dtype == torch.uint8:
        x.div_(255)
    x = _random_jitter_(x, cfg, d, sync_free)
    x = _masked_(x, d.gray, lambda xs, _: to_grayscale(xs), sync_free)
    kernel = cfg.blur_kernel or blur_kernel_size(size)
    x = _masked_(x, d.blur, lambda xs, idx: gaussian_blur(xs, d.sigma[idx], kernel), sync_free)
    mean, std = channel_constant(cfg.mean, x.device, x.dtype), channel_constant(cfg.std, x.device, x.dtype)
    return x.sub_(mean).div_(std)


def _with_background(x: Tensor, bg: BackgroundDraws, peak: float, sync_free: bool) -> Tensor:
    """x (B, 3, H, W) in [0, peak] with the drawn views' black canvas replaced by their backgrounds; a copy
    (x may be the caller's float images)."""
    def paint(xs: Tensor, idx: Tensor) -> Tensor:
        return composite(xs, background(bg.noise[idx], bg.u[idx]), peak)

    return _masked_(x.clone(), bg.on, paint, sync_free)


def augment(images: Tensor, cfg: AugmentConfig, generator: torch.Generator,
            out_size: int | None = None, rows: tuple[int, int] | None = None) -> Tensor:
    """Augment a batch (:func:`draw`, then :func:`apply`); each sample its own draws.

    images: uint8 (B, H, W, 3) channels-last (as the fractal renderer writes them) or float (B, 3, H, W) in
    [0, 1], on any device. Returns float32 (B, 3, out_size, out_size), normalised; out_size defaults to H.
    ``rows = (start, total)``: the images are rows start..start + B of a batch of ``total`` (one process's
    share of a global batch); the generator draws for the whole batch and each image gets its row's draws,
    so the shares together equal the whole batch augmented at once and the generator ends in the same state.
    """
    return apply(images, draw_for(images, cfg, generator, rows), cfg, out_size)


def draw_for(images: Tensor, cfg: AugmentConfig, generator: torch.Generator,
             rows: tuple[int, int] | None = None) -> Draws:
    """:func:`draw` for this batch of images (its size and device), checked; ``rows`` as :func:`augment`."""
    b, (h, w) = len(images), _image_size(images)
    start, n = rows or (0, b)
    if not 0 <= start <= n - b:
        raise ValueError(f"rows {start}..{start + b} do not lie in a batch of {n}")
    return draw(cfg, n, h, w, generator, images.device, slice(start, start + b))


def check_images(x: Tensor) -> None:
    """Refuse anything but a uint8 (B, S, S, 3) batch, the layout images are held in."""
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[3] != 3 or x.shape[1] != x.shape[2]:
        raise ValueError(f"expected uint8 (B, S, S, 3) images, got {x.dtype} {tuple(x.shape)}")


def normalise(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """float (B, 3, H, W) in 0..255 -> (x / 255 - mean) / std, in place."""
    m, s = channel_constant(mean, x.device, x.dtype), channel_constant(std, x.device, x.dtype)
    return x.div_(255).sub_(m).div_(s)


def eval_batch(x: Tensor, input_size: int, mean: tuple[float, ...] = IMAGENET_MEAN,
               std: tuple[float, ...] = IMAGENET_STD) -> Tensor:
    """uint8 (B, S, S, 3) -> float32 (B, 3, input, input), normalised; resized (bilinear, antialiased when
    shrinking) when S differs from ``input_size``."""
    check_images(x)
    out = x.permute(0, 3, 1, 2).float()
    if x.shape[1] != input_size:
        out = F.interpolate(out, size=(input_size, input_size), mode="bilinear", align_corners=False,
                            antialias=input_size < x.shape[1])
    return normalise(out, mean, std)


# ---- decoded files as 8-bit RGB ------------------------------------------------------------------------
_SIXTEEN_BIT = 65535 / 255  # a 16-bit value v is the 8-bit value v / 257


def pil_rgb(img):
    """A PIL image as 8-bit RGB, what every reader stores. PIL's ``convert("RGB")`` alone clips 16- and
    32-bit grey (mode ``I;16``, ``I``: many X-ray and microscopy sets) to 255, so almost every pixel comes
    out white; such images are scaled from 16 bits to 8 instead (``I`` holds a 16-bit file's values; larger
    ones clip). Transparent pixels (RGBA, LA, PA, or a palette or grey image with a transparent colour) are
    composited on black, as their colour under a zero alpha is arbitrary. Float images (mode ``F``) have no
    agreed range: ValueError."""
    import numpy as np
    from PIL import Image

    mode = img.mode
    if mode == "F":
        raise ValueError("32-bit float images (PIL mode F) have no agreed range; convert them to 8 or 16 bit")
    if mode.startswith("I"):  # I;16, I;16B, I;16L, I;16N, I
        values = np.asarray(img, dtype=np.float64) / _SIXTEEN_BIT
        img = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), mode="L")
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        black = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        return Image.alpha_composite(black, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")
