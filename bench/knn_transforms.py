"""Does the kNN probe's gap lie in a shared feature offset? A diagnostic of issue 38, not the probe.

The fair probe (``pretrain.probe``: BatchNorm re-estimated on each fold's training images, then Wu et al.
2018's weighted kNN on l2-normalised features) is run on every image of a probe set with ``--folds``, and
beside its own figure the same kNN on three transforms of the same features, fitted on each fold's
training features only:

- ``centred``: minus the training mean, then l2-normalised (the "CL2N" of SimpleShot, Wang et al. 2019);
- ``centred_perp``: centred, then the mean's direction projected out (the same as projecting it out of
  the raw features: the mean has no component off its own direction).

If pre-trained features carried class neighbourhoods under an offset that the uncentred cosine hides,
``centred`` would gain over ``cos`` for them and not for the random inits. One JSON line per backbone:
the random inits of ``--seeds`` first, then each checkpoint; first of all, the same kNN on the images'
pixels (no backbone: the 32 x 32 x 3 values as a vector, as they are and minus each image's mean, and
the same in grey), the level a backbone's 64 pooled features are measured against.

    python bench/knn_transforms.py weights/fps-mocov2-t05-resnet20-cpu-1m.ckpt \\
        --data-root ../shared/data/cifar10-probe --folds 5
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import Tensor

from analysis.probe import probe_data
from fpsfl.base.checkpoint import load_backbone_weights, load_checkpoint
from pretrain.backbones import create_backbone
from pretrain.probe import ProbeData, knn_accuracy, reestimate_bn


@torch.no_grad()
def raw_features(backbone: torch.nn.Module, images: Tensor, size: int) -> Tensor:
    """The backbone's features (N, D) before the probe's l2 normalisation, eval mode."""
    from fpsfl.base.images import eval_batch

    backbone.eval()
    return torch.cat([backbone(eval_batch(images[i:i + 256], size)).float()
                      for i in range(0, len(images), 256)])


def transforms(train: Tensor, test: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """The kNN's inputs under each transform, every statistic from the training features."""
    mean = train.mean(0)
    unit = mean / mean.norm().clamp_min(1e-12)

    def perp(x: Tensor) -> Tensor:
        return x - (x @ unit)[:, None] * unit

    pairs = {"cos": (train, test), "centred": (train - mean, test - mean),
             "centred_perp": (perp(train - mean), perp(test - mean))}
    return {k: (F.normalize(a, dim=1), F.normalize(b, dim=1)) for k, (a, b) in pairs.items()}


def knn_by_transform(backbone: torch.nn.Module, data: ProbeData, size: int) -> dict[str, float]:
    """kNN accuracy (%) of each transform, pooled over the folds' scored images; ``mean_cos``: the mean
    pairwise cosine of the first fold's normalised training features (1: all one direction)."""
    right: dict[str, float] = {}
    mean_cos = None
    for split in data.splits():
        fitted = reestimate_bn(backbone, split.train_x, size)
        train, test = raw_features(fitted, split.train_x, size), raw_features(fitted, split.test_x, size)
        for name, (a, b) in transforms(train, test).items():
            acc = knn_accuracy(a, split.train_y, b, split.test_y, split.n_classes)
            right[name] = right.get(name, 0.0) + acc * len(split.test_y)
        if mean_cos is None:
            unit = F.normalize(train, dim=1)
            mean_cos = float((unit @ unit.T).mean())
    out = {name: round(100 * r / data.n_scored, 2) for name, r in right.items()}
    return {**out, "mean_cos": round(mean_cos, 4)}


def knn_on_pixels(data: ProbeData) -> dict[str, float]:
    """kNN accuracy (%) of the same vote on the raw pixels, as they are and minus each image's mean, in
    colour and in grey (the channels' mean): how much of the pixels' own signal is colour."""
    right: dict[str, float] = {}
    for split in data.splits():
        for colour in ("", "grey_"):
            train, test = (x.float().mean(-1) if colour else x.float() for x in (split.train_x, split.test_x))
            train, test = train.flatten(1), test.flatten(1)
            for name, (a, b) in {"pixels": (train, test),
                                 "pixels_centred": (train - train.mean(1, keepdim=True),
                                                    test - test.mean(1, keepdim=True))}.items():
                acc = knn_accuracy(F.normalize(a, dim=1), split.train_y, F.normalize(b, dim=1),
                                   split.test_y, split.n_classes)
                right[colour + name] = right.get(colour + name, 0.0) + acc * len(split.test_y)
    return {name: round(100 * r / data.n_scored, 2) for name, r in right.items()}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of this script and of bench/feature_colour.py: the probe set, the random inits, threads."""
    parser.add_argument("ckpts", nargs="*", help="pretrain checkpoints")
    parser.add_argument("--dataset", default="imagefolder", help="a federate dataset (default: imagefolder)")
    parser.add_argument("--data-root", default="../shared/data/cifar10-probe", help="its root")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds (0: the test split)")
    parser.add_argument("--input-size", type=int, default=32, help="px")
    parser.add_argument("--arch", default="resnet20", help="the random inits' backbone")
    parser.add_argument("--seeds", type=int, default=3, help="random inits (seeds 0..N-1)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")


def backbones(args: argparse.Namespace):
    """(name, backbone) for the random inits of ``--seeds``, then for each checkpoint, built one at a time."""
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        yield f"random init, seed {seed}", create_backbone(args.arch)
    for path in args.ckpts:
        ckpt = load_checkpoint(path)
        backbone = create_backbone(ckpt["arch"], ckpt["width"])
        load_backbone_weights(backbone, ckpt, where=path)
        yield path, backbone


def parse(doc: str, extra=None) -> tuple[argparse.Namespace, ProbeData]:
    """The parsed flags of this script or of a diagnostic beside it (``doc``: its docstring; ``extra``:
    a function adding that script's own flags to the parser), threads set, and the probe set they name."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    add_flags(parser)
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args, probe_data(args.dataset, args.data_root, 0, args.folds)


def main() -> None:
    args, data = parse(__doc__)
    print(json.dumps({"backbone": "none: the images' pixels", **knn_on_pixels(data)}), flush=True)
    for name, backbone in backbones(args):
        print(json.dumps({"backbone": name, **knn_by_transform(backbone, data, args.input_size)}), flush=True)

if __name__ == "__main__":
    main()
