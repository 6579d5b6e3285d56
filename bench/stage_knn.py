"""Which stage loses the digits? The fair kNN on each stage's pooled output (issue 38's diagnostic).

The fair probe (``pretrain.probe``) scores the backbone's output, the last stage's features after global
average pooling. Here the same weighted kNN (BatchNorm re-estimated on each fold's training images, Wu et
al. 2018's vote on l2-normalised features, pooled over ``--folds``) is taken on the globally average-pooled
output of every stage of a CIFAR ResNet (``layer1`` 16, ``layer2`` 32, ``layer3`` 64 channels at width 1;
``layer3`` is the probe's own figure). If pre-training keeps what a random init's early stages carry and
its last stage loses it, ``layer2`` holds level with the random inits while ``layer3`` falls. One JSON line
per backbone, the random inits of ``--seeds`` first; ``confusions``: the five digit pairs the last stage's
kNN mixes most, over every scored image.

    python bench/stage_knn.py weights/fps-mocov2-t05-resnet20-cpu-1m.ckpt --dataset digits --folds 5
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from knn_transforms import backbones, parse  # bench/, beside this script
from torch import Tensor, nn

from fpsfl.base.images import eval_batch
from pretrain.probe import ProbeData, knn_predict, reestimate_bn

STAGES = ("layer1", "layer2", "layer3")  # the CIFAR ResNets' stages (pretrain.backbones.cifar_resnet)


@torch.no_grad()
def stage_features(backbone: nn.Module, images: Tensor, size: int) -> dict[str, Tensor]:
    """{stage: (N, C) l2-normalised globally average-pooled output} of uint8 (N, S, S, 3) images, eval
    mode."""
    backbone.eval()
    pooled: dict[str, list[Tensor]] = {s: [] for s in STAGES}
    hooks = [getattr(backbone, s).register_forward_hook(
        lambda _m, _i, out, s=s: pooled[s].append(out.float().mean((2, 3)))) for s in STAGES]
    try:
        for i in range(0, len(images), 256):
            backbone(eval_batch(images[i:i + 256], size))
    finally:
        for h in hooks:
            h.remove()
    return {s: F.normalize(torch.cat(v), dim=1) for s, v in pooled.items()}


def knn_by_stage(backbone: nn.Module, data: ProbeData, size: int) -> dict:
    """kNN accuracy (%) of each stage, pooled over the folds' scored images, and the last stage's most
    confused class pairs (both directions counted)."""
    right = dict.fromkeys(STAGES, 0)
    confusion = torch.zeros(data.n_classes, data.n_classes)
    for split in data.splits():
        fitted = reestimate_bn(backbone, split.train_x, size)
        train, test = stage_features(fitted, split.train_x, size), stage_features(fitted, split.test_x, size)
        for stage in STAGES:
            predicted = knn_predict(train[stage], split.train_y, test[stage], split.n_classes)
            right[stage] += int((predicted == split.test_y).sum())
        confusion.index_put_((split.test_y, predicted), torch.ones(len(predicted)), accumulate=True)
    mixed = confusion + confusion.T
    pairs = sorted(((int(mixed[i, j]), i, j) for i in range(data.n_classes)
                    for j in range(i + 1, data.n_classes)), reverse=True)[:5]
    return {**{s: round(100 * r / data.n_scored, 2) for s, r in right.items()},
            "confusions": {f"{i}/{j}": n for n, i, j in pairs}}


def main() -> None:
    args, data = parse(__doc__)
    for name, backbone in backbones(args):
        print(json.dumps({"backbone": name, **knn_by_stage(backbone, data, args.input_size)}), flush=True)


if __name__ == "__main__":
    main()
