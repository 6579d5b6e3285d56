"""Do the features ignore a horizontal flip, and does the kNN need what a flip changes? (issue 38)

MoCo-v2's views are flipped independently (p = 0.5 each), so InfoNCE rewards features that ignore a
horizontal flip; `--flips own` adds the 8 symmetries of the square per fractal. A digit's mirror image
is not that digit; a natural image's mostly is. Per backbone, over the fair probe's folds (BatchNorm
re-estimated on each fold's training images, every image scored once):

- ``flip_inv``: how much closer a scored image's output feature is to its own mirror image's than to
  another image's, (cos(f(x), f(flip x)) - cos(f(x), f(y))) / (1 - cos(f(x), f(y))), averaged over the
  folds: 1 when the features ignore the flip, 0 when a mirror image is as far as any other image;
- ``knn``: the fair probe's kNN (it equals ``analyze probe``'s, tested);
- ``knn_sym``: the same kNN on flip-symmetrised features, f(x) + f(flip x), train and test alike: what the
  kNN loses when the features are made exactly flip-invariant.

    python bench/flip_knn.py weights/fps-mocov2-t05-resnet20-cpu-1m.ckpt --dataset digits --folds 5
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from knn_transforms import backbones, parse, raw_features  # bench/, beside this script
from torch import Tensor, nn

from pretrain.probe import ProbeData, knn_predict, reestimate_bn


def flip_invariance(plain: Tensor, mirrored: Tensor) -> tuple[float, float]:
    """(mean cosine of each row of ``plain`` to its mirror image's row, mean cosine to the next row's):
    the second is the floor a flip-blind comparison is measured against."""
    a, b = F.normalize(plain, dim=1), F.normalize(mirrored, dim=1)
    return float((a * b).sum(1).mean()), float((a * a.roll(1, 0)).sum(1).mean())


@torch.no_grad()
def knn_flip(backbone: nn.Module, data: ProbeData, size: int) -> dict[str, float]:
    """flip_inv, the cosines it is made of, and the kNN accuracy (%) of the plain and the flip-symmetrised
    features, pooled over the folds' scored images."""
    right = {"knn": 0, "knn_sym": 0}
    same, other = [], []
    for split in data.splits():
        fitted = reestimate_bn(backbone, split.train_x, size)
        train, test = (raw_features(fitted, x, size) for x in (split.train_x, split.test_x))
        train_m, test_m = (raw_features(fitted, x.flip(2), size) for x in (split.train_x, split.test_x))
        s, o = flip_invariance(test, test_m)
        same.append(s)
        other.append(o)
        for name, (tr, te) in {"knn": (train, test), "knn_sym": (train + train_m, test + test_m)}.items():
            predicted = knn_predict(F.normalize(tr, dim=1), split.train_y, F.normalize(te, dim=1),
                                    split.n_classes)
            right[name] += int((predicted == split.test_y).sum())
    cs, co = sum(same) / len(same), sum(other) / len(other)
    return {"flip_inv": round((cs - co) / (1 - co), 4), "cos_flip": round(cs, 4), "cos_other": round(co, 4),
            **{k: round(100 * v / data.n_scored, 2) for k, v in right.items()}}


def main() -> None:
    args, data = parse(__doc__)
    for name, backbone in backbones(args):
        print(json.dumps({"backbone": name, **knn_flip(backbone, data, args.input_size)}), flush=True)


if __name__ == "__main__":
    main()
