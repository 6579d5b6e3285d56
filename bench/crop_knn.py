"""Do the features ignore where a view is cropped, and what does the kNN lose if they do? (issue 38)

MoCo-v2's views are random resized crops of area U(crop_min, 1) (``crop_min`` 0.2, MoCo-v2's), so
InfoNCE rewards features that map two crops of an image to one point. Does the kNN of a probe set
need what such crops change? Per backbone, over the fair probe's folds (BatchNorm re-estimated on each
fold's training images, every image scored once), for each crop scale s of ``--scales``:

- ``crop_inv_S``: how much closer two crops of one image are than crops of two images,
  (cos(f(c1 x), f(c2 x)) - cos(f(c1 x), f(c2 y))) / (1 - cos(f(c1 x), f(c2 y))), crops of area
  U(s, 1), averaged over the folds: 1 when the features ignore the crop, 0 when two crops of one image
  are as far apart as crops of two images;
- ``knn_crop_S``: the fair kNN on crop-averaged features, the mean of f over ``--crops`` crops, train
  and test alike: what the kNN keeps when the features are made (nearly) crop-invariant;
- ``knn``: the fair probe's kNN (it equals ``analyze probe``'s, tested).

The flip's counterpart is bench/flip_knn.py. The crops are drawn by the pre-training's own sampler
(``fpsfl.base.images.sample_crop_boxes``, aspect ratio in [3/4, 4/3]), unflipped, one generator seeded
once per fold, so every backbone sees the same crops.

    python bench/crop_knn.py weights/fps-mocov2-t05-resnet20-cpu-1m.ckpt --dataset digits --folds 5
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from knn_transforms import backbones, parse, raw_features  # bench/, beside this script
from torch import Tensor, nn

from fpsfl.base.images import resized_crop, sample_crop_boxes
from pretrain.probe import ProbeData, knn_predict, reestimate_bn

RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect range, as the pre-training's views


def crops(images: Tensor, scale: float, generator: torch.Generator) -> Tensor:
    """uint8 (N, S, S, 3) -> one random resized crop of each, of area U(scale, 1), resized back to S px."""
    n, h, w, _ = images.shape
    boxes = sample_crop_boxes(n, h, w, (scale, 1.0), RATIO, generator, "cpu")
    out = resized_crop(images.permute(0, 3, 1, 2).float(), boxes, h, torch.zeros(n, dtype=torch.bool))
    return out.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def crop_invariance(first: Tensor, second: Tensor) -> float:
    """The normalised gap between the mean cosine of row i of ``first`` to row i of ``second`` (two crops
    of one image) and to row i + 1 (a crop of another image)."""
    a, b = F.normalize(first, dim=1), F.normalize(second, dim=1)
    same, other = float((a * b).sum(1).mean()), float((a * b.roll(1, 0)).sum(1).mean())
    return (same - other) / (1 - other)


@torch.no_grad()
def knn_crop(backbone: nn.Module, data: ProbeData, size: int, scales: tuple[float, ...] = (0.2, 0.5),
             n_crops: int = 4, seed: int = 0) -> dict[str, float]:
    """knn, and per scale crop_inv and the kNN accuracy (%) of the crop-averaged features, pooled over the
    folds' scored images."""
    right: dict[str, int] = {}
    inv: dict[float, list[float]] = {s: [] for s in scales}
    for fold, split in enumerate(data.splits()):
        fitted = reestimate_bn(backbone, split.train_x, size)
        feats = {"knn": (raw_features(fitted, split.train_x, size), raw_features(fitted, split.test_x, size))}
        for s in scales:
            g = torch.Generator().manual_seed(seed * 1_000_003 + fold)
            train = [raw_features(fitted, crops(split.train_x, s, g), size) for _ in range(n_crops)]
            test = [raw_features(fitted, crops(split.test_x, s, g), size) for _ in range(max(n_crops, 2))]
            inv[s].append(crop_invariance(test[0], test[1]))
            feats[f"knn_crop_{s:g}"] = (torch.stack(train).mean(0), torch.stack(test[:n_crops]).mean(0))
        for name, (tr, te) in feats.items():
            predicted = knn_predict(F.normalize(tr, dim=1), split.train_y, F.normalize(te, dim=1),
                                    split.n_classes)
            right[name] = right.get(name, 0) + int((predicted == split.test_y).sum())
    out = {k: round(100 * v / data.n_scored, 2) for k, v in right.items()}
    return {**out, **{f"crop_inv_{s:g}": round(sum(v) / len(v), 4) for s, v in inv.items()}}


def _scale(text: str) -> float:
    """A smallest crop area, as a fraction of the image in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1]")
    return value


def _count(text: str) -> int:
    """A number of crops, at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is below 1")
    return value


def crop_flags(parser: argparse.ArgumentParser) -> None:
    """This script's flags beside the diagnostics' shared ones (bench/knn_transforms.py)."""
    parser.add_argument("--scales", type=_scale, nargs="+", default=[0.2, 0.5],
                        help="smallest crop areas, fractions of the image (default: 0.2, MoCo-v2's, and 0.5)")
    parser.add_argument("--crops", type=_count, default=4, help="crops averaged per image (default: 4)")


def main() -> None:
    args, data = parse(__doc__, crop_flags)
    for name, backbone in backbones(args):
        out = knn_crop(backbone, data, args.input_size, tuple(args.scales), args.crops)
        print(json.dumps({"backbone": name, **out}), flush=True)


if __name__ == "__main__":
    main()
