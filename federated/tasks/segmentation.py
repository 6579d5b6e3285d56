"""Semantic segmentation as a federated task: Cityscapes with DeepLabV3+ (Chen et al., ICLR 2023, Table 5).

The model is segmentation-models-pytorch's ``DeepLabV3Plus`` with a MobileNetV2 encoder at output stride
16 (Appendix B.1); the encoder is the ``mobilenet_v2`` backbone of :mod:`pretrain.backbones`, so a
``pretrain`` checkpoint loads into it tensor for tensor. Training crops (768 px in the paper) come from a
random rescale (x0.5-2) + random crop + horizontal flip, applied to image and label together as one
batched ``grid_sample`` (bilinear for images, nearest for labels; outside the image labels are 255,
ignored). The metric is mIoU over a confusion matrix accumulated over the test set; a class absent from
both prediction and ground truth is left out of the mean rather than counted as 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.images import IMAGENET_MEAN, IMAGENET_STD, crop_theta, normalise

from ..datasets.stream import chunks
from . import TASKS
from .base import Task
from .transforms import add_noise

IGNORE = 255  # Cityscapes' ignore train id
SCALE_RANGE = (0.5, 2.0)  # random rescale of DeepLab training (Chen et al. 2018)


def confusion(pred: Tensor, target: Tensor, n_classes: int) -> Tensor:
    """(C, C) int64 counts of (true class, predicted class) over pixels whose target is not 255."""
    valid = target != IGNORE
    index = target[valid].long() * n_classes + pred[valid].long()
    return torch.bincount(index, minlength=n_classes * n_classes).view(n_classes, n_classes)


def iou_from_confusion(conf: Tensor) -> tuple[Tensor, float, float]:
    """Per-class IoU (NaN for a class absent from prediction and truth), mIoU over the others, pixel
    accuracy."""
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.full_like(tp, float("nan")))
    present = ~iou.isnan()
    miou = iou[present].mean().item() if present.any() else float("nan")
    return iou, miou, (tp.sum() / conf.sum().clamp_min(1)).item()


def scale_crop_boxes(b: int, h: int, w: int, crop: int, generator: torch.Generator,
                     device: torch.device) -> Tensor:
    """Boxes (B, 4) = (x0, y0, side, side) px: a crop of ``crop`` px after rescaling by s ~ U(0.5, 2) is a
    square of crop / s px of the original, placed uniformly (it may overhang when larger than the image)."""
    u = torch.rand(3, b, generator=generator, device=generator.device).to(device)
    side = crop / (SCALE_RANGE[0] + (SCALE_RANGE[1] - SCALE_RANGE[0]) * u[0])
    x0 = torch.minimum(torch.zeros_like(side), w - side) + u[1] * (w - side).abs()
    y0 = torch.minimum(torch.zeros_like(side), h - side) + u[2] * (h - side).abs()
    return torch.stack((x0, y0, side, side), 1)


def scale_crop_flip(x: Tensor, y: Tensor, crop: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """uint8 images (B, H, W, 3) and train-id labels (B, H, W) -> float (B, 3, crop, crop) in 0..255 and
    int64 labels (B, crop, crop), with one random scale, crop and flip per sample shared by both."""
    b, h, w = y.shape
    dev = x.device
    boxes = scale_crop_boxes(b, h, w, crop, generator, dev)
    flip = (torch.rand(b, generator=generator, device=generator.device) < 0.5).to(dev)
    grid = F.affine_grid(crop_theta(boxes, h, w, flip), [b, 1, crop, crop], align_corners=False)
    image = F.grid_sample(x.permute(0, 3, 1, 2).float(), grid, mode="bilinear", padding_mode="zeros",
                          align_corners=False)
    shifted = F.grid_sample((y[:, None].float() + 1), grid, mode="nearest", padding_mode="zeros",
                            align_corners=False)[:, 0].long() - 1  # outside the image: 0 - 1 = -1
    return image, torch.where(shifted < 0, IGNORE, shifted)


def resize_pair(x: Tensor, y: Tensor, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """uint8 (B, H, W, 3), (B, H, W) -> float (B, 3, h, w) 0..255 and int64 (B, h, w); labels nearest."""
    image = x.permute(0, 3, 1, 2).float()
    label = y.long()
    if tuple(y.shape[1:]) != tuple(size):
        image = F.interpolate(image, size=size, mode="bilinear", align_corners=False,
                              antialias=size[0] < y.shape[1])
        label = F.interpolate(y[:, None].float(), size=size, mode="nearest")[:, 0].long()
    return image, label


class SegmentationTask:
    """DeepLabV3+ (MobileNetV2) on 19 Cityscapes classes: per-pixel cross-entropy, mIoU."""

    provides = frozenset()  # no pooled features + linear head (MOON), no per-sample class (FedIR)
    eval_batch = 4  # full-resolution test images per forward pass

    def __init__(self, n_classes: int, crop_size: int, eval_size: tuple[int, int]):
        self.n_classes, self.crop_size, self.eval_size = n_classes, crop_size, eval_size

    def build_model(self, backbone: nn.Module) -> nn.Module:
        import segmentation_models_pytorch as smp  # here: smp loads timm and torchvision (~2 s)

        model = smp.DeepLabV3Plus(encoder_name="mobilenet_v2", encoder_weights=None, classes=self.n_classes,
                                  encoder_output_stride=16)
        model.encoder.load_state_dict(backbone.state_dict())  # the (possibly pre-trained) backbone's weights
        return model

    def train_inputs(self, x: Tensor, y: Tensor, generator: torch.Generator,
                     noise: float) -> tuple[Tensor, Tensor]:
        image, label = scale_crop_flip(x, y, self.crop_size, generator)
        image = normalise(image, IMAGENET_MEAN, IMAGENET_STD)
        return (add_noise(image, noise, generator) if noise > 0 else image), label

    def eval_inputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        image, label = resize_pair(x, y, self.eval_size)
        return normalise(image, IMAGENET_MEAN, IMAGENET_STD), label

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        """Mean cross-entropy over each sample's labelled pixels, (B,)."""
        per_pixel = F.cross_entropy(output.float(), target, ignore_index=IGNORE, reduction="none")
        valid = (target != IGNORE).flatten(1).sum(1).clamp_min(1)
        return per_pixel.flatten(1).sum(1) / valid

    def sample_labels(self, y: Tensor) -> Tensor:
        """Each image's most frequent labelled class: what label-skew partitions split on."""
        counts = torch.stack([torch.bincount(m[m != IGNORE].long(), minlength=self.n_classes) for m in y])
        return counts.argmax(1)

    def class_counts(self, y: Tensor) -> Tensor:
        """Labelled pixels per class (the partition heatmap shows pixel counts)."""
        return torch.bincount(y[y != IGNORE].long(), minlength=self.n_classes)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, x: Tensor, y: Tensor) -> dict:
        """``acc`` is the mIoU (the main metric); also pixel accuracy, per-class IoU and the mean loss."""
        was_training = model.training
        model.eval()
        conf = torch.zeros(self.n_classes, self.n_classes, dtype=torch.long, device=x.device)
        loss = 0.0
        step = self.eval_batch
        for images, labels in chunks(x, y, step):
            inputs, target = self.eval_inputs(images, labels)
            out = model(inputs)
            loss += self.loss(out, target).sum().item()
            conf += confusion(out.argmax(1), target, self.n_classes)
        model.train(was_training)
        iou, miou, pixel_acc = iou_from_confusion(conf.cpu())
        return {"acc": miou, "loss": loss / max(len(x), 1), "miou": miou, "pixel_acc": pixel_acc,
                "iou": [None if v != v else round(float(v), 5) for v in iou]}


def parse_size(text: str) -> tuple[int, int]:
    """'1024x2048' (height x width) or '512' (square) -> (h, w)."""
    parts = text.lower().split("x")
    try:
        h, w = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, 0)
    except ValueError:
        h = w = 0
    if h <= 0 or w <= 0:
        raise ValueError(f"--eval-size expects HxW such as 1024x2048, got {text!r}")
    return h, w


@TASKS.register(name="segmentation")
def segmentation(data, cfg) -> Task:
    """The task of a segmentation dataset: ``--crop-size`` crops, tested at ``--eval-size`` (or as stored)."""
    native = tuple(data.test_y.shape[1:])
    eval_size = parse_size(cfg.eval_size) if cfg.eval_size else native
    return SegmentationTask(data.n_classes, cfg.crop_size or data.input_size, eval_size)
