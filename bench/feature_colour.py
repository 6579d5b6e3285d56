"""Do a backbone's features still hold the images' colour? A diagnostic of issue 38, not the probe.

FPS pairs colour each view's fractal with its own random hue (Chen et al., ICLR 2023, App. A.1.2), so the
contrastive loss rewards features that ignore hue. On natural images colour is part of the class signal
(the probe set's own pixels: kNN 29.1% in colour, 4-5 points above grey). This script asks how much of
each image's colour a linear read-out of the backbone's features recovers:

- ``chroma``: the image's mean over pixels of max(R, G, B) - min(R, G, B) (HSV's chroma, in [0, 1]);
- ``hue_cos`` / ``hue_sin``: its chroma-weighted mean hue, as a point on the circle;
- ``brightness``: its mean over pixels and channels (a colour-free control).

For every fold of the probe set (the fair probe's folds, BatchNorm re-estimated on the fold's training
images, eval-mode features standardised on them), a ridge regression fitted on the training features
predicts each target of the scored images; the figure is the R^2 pooled over the folds (1: read out
exactly; 0: no better than the training mean; below 0: worse). One JSON line per backbone: the random
inits of ``--seeds`` first, then each checkpoint.

    python bench/feature_colour.py weights/fps-mocov2-t05-resnet20-cpu-1m.ckpt \\
        --data-root ../shared/data/cifar10-probe --folds 5
"""

from __future__ import annotations

import json
import math

import torch
from knn_transforms import backbones, parse, raw_features  # bench/, beside this script
from torch import Tensor

from pretrain.probe import ProbeData, reestimate_bn

RIDGE = 1.0  # the penalty on standardised features (64 of them for ResNet20; ~2,400 training images a fold)
TARGETS = ("chroma", "hue_cos", "hue_sin", "brightness")


def colour_targets(images: Tensor) -> Tensor:
    """(N, 4) targets of uint8 (N, S, S, 3) images, in the order of ``TARGETS``."""
    x = images.float() / 255.0
    hi, lo = x.amax(-1), x.amin(-1)
    chroma = hi - lo
    r, g, b = x.unbind(-1)
    # hue as an angle (the hexagonal hue of HSV, read as atan2 of the colour-opponent axes)
    angle = torch.atan2(math.sqrt(3.0) * (g - b), 2 * r - g - b)
    weight = chroma.flatten(1)
    norm = weight.sum(1).clamp_min(1e-8)
    hue_cos = (weight * angle.flatten(1).cos()).sum(1) / norm
    hue_sin = (weight * angle.flatten(1).sin()).sum(1) / norm
    return torch.stack([chroma.flatten(1).mean(1), hue_cos, hue_sin, x.flatten(1).mean(1)], dim=1)


def ridge_predict(train_f: Tensor, train_t: Tensor, test_f: Tensor, penalty: float = RIDGE) -> Tensor:
    """Ridge regression of ``train_t`` on the standardised ``train_f``, evaluated at ``test_f``."""
    mean, std = train_f.mean(0), train_f.std(0).clamp_min(1e-6)
    a, b = (train_f - mean) / std, (test_f - mean) / std
    a, b = a.double(), b.double()
    centre = train_t.mean(0).double()
    gram = a.T @ a + penalty * torch.eye(a.shape[1], dtype=a.dtype)
    weights = torch.linalg.solve(gram, a.T @ (train_t.double() - centre))
    return (b @ weights + centre).float()


def colour_r2(backbone: torch.nn.Module, data: ProbeData, size: int) -> dict[str, float]:
    """R^2 of each target, pooled over the folds' scored images."""
    truth, guess = [], []
    for split in data.splits():
        fitted = reestimate_bn(backbone, split.train_x, size)
        train_f, test_f = raw_features(fitted, split.train_x, size), raw_features(fitted, split.test_x, size)
        guess.append(ridge_predict(train_f, colour_targets(split.train_x), test_f))
        truth.append(colour_targets(split.test_x))
    t, g = torch.cat(truth), torch.cat(guess)
    r2 = 1 - ((t - g) ** 2).sum(0) / ((t - t.mean(0)) ** 2).sum(0)
    return {name: round(float(v), 3) for name, v in zip(TARGETS, r2, strict=True)}


def main() -> None:
    args, data = parse(__doc__)
    for name, backbone in backbones(args):
        print(json.dumps({"backbone": name, **colour_r2(backbone, data, args.input_size)}), flush=True)

if __name__ == "__main__":
    main()
