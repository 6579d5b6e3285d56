"""How good is a backbone without a federation: kNN and linear probes of its frozen features.

The standard evaluation of self-supervised pre-training (Wu et al., CVPR 2018; as lightly's benchmarking
utilities do it): embed a labelled training and test set with the frozen backbone, then classify each test
image by a weighted vote of its k nearest training images (cosine similarity, weights exp(s / T)), and by a
multinomial logistic regression on the standardised features (the linear probe). :func:`effective_rank`
(RankMe) is the label-free signal logged beside them while pre-training. Chen et al., ICLR 2023
evaluate FPS pre-training only through federated fine-tuning; a probe tells in seconds whether a checkpoint
learned anything, and ``pretrain --probe digits`` logs it while pre-training runs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.batchnorm import recompute_bn
from fpsfl.base.images import eval_batch

DIGITS_TEST = 0.2  # share of sklearn's 1,797 digits in the fixed test set
DIGITS_LEVELS = 16  # sklearn's digits take values 0..16
KNN_K = 20  # neighbours: Wu et al. use 200 of ImageNet's 1.28M images; digits has 1,437 training images
KNN_TEMPERATURE = 0.1  # Wu et al. 2018 (lightly's knn_predict default)


@dataclass(frozen=True)
class ProbeData:
    """A labelled image set: uint8 (N, S, S, 3) images and int64 labels, train and test, and how a probe
    scores it: on its test split (``folds`` 0), or by ``folds``-fold cross-validation over train and test
    pooled, which scores every image once (on the CIFAR-10 probe set 3,052 images instead of 509: a
    checkpoint's figure moves about 0.8 points with the draw instead of 2.0)."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    n_classes: int
    folds: int = 0

    @property
    def n_scored(self) -> int:
        """Images whose predictions make the accuracy."""
        return len(self.test_y) + (len(self.train_y) if self.folds else 0)

    def check_folds(self) -> None:
        """A one-line ValueError unless ``folds`` is 0 or between 2 and the smallest class's pooled images
        (stratified folds need an image of every class in each)."""
        if not self.folds:
            return
        counts = torch.bincount(torch.cat([self.train_y, self.test_y]), minlength=self.n_classes)
        smallest = int(counts[counts > 0].min())
        if not 2 <= self.folds <= smallest:
            raise ValueError(f"folds must be at least 2 and at most the smallest class's {smallest} images, "
                             f"got {self.folds}")

    def splits(self) -> list[ProbeData]:
        """The (train, test) pairs scored: the split itself, or the stratified folds of the pooled images,
        drawn with seed 0 so that every backbone (random inits included) meets the same folds."""
        if not self.folds:
            return [self]
        from sklearn.model_selection import StratifiedKFold

        self.check_folds()
        x, y = torch.cat([self.train_x, self.test_x]), torch.cat([self.train_y, self.test_y])
        kfold = StratifiedKFold(self.folds, shuffle=True, random_state=0)
        return [ProbeData(x[tr], y[tr], x[te], y[te], self.n_classes)
                for tr, te in kfold.split(np.zeros(len(y)), y.numpy())]


def digits(size: int = 32) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """sklearn's 1,797 digits, upsampled (bilinear) to ``size`` px grey RGB, 0..255: (train_x, train_y,
    test_x, test_y) of a fixed stratified 80/20 split (seed 0: the test set never changes). Also the reader
    of ``federate --dataset digits``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.from_numpy(data.images).float()[:, None] * (255 / DIGITS_LEVELS)  # (N, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).expand(-1, -1, -1, 3).contiguous()
    y = torch.from_numpy(data.target.astype(np.int64))
    train, test = train_test_split(np.arange(len(y)), test_size=DIGITS_TEST, stratify=data.target,
                                   random_state=0)
    train, test = torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(test))
    return x[train], y[train], x[test], y[test]


def digits_probe(size: int = 32) -> ProbeData:
    return ProbeData(*digits(size), n_classes=10)


BN_MODES = ("reestimate", "eval")  # the fair probe (default) and the eval-mode one, labelled as such


@torch.no_grad()
def reestimate_bn(backbone: nn.Module, images: Tensor, input_size: int, batch_size: int = 256) -> nn.Module:
    """A copy of ``backbone`` whose BatchNorm running statistics are re-estimated on ``images`` (uint8
    (N, S, S, 3)): reset, then the cumulative mean and variance over one pass (momentum None), every other
    module in eval mode. The fair probe's first step (issue 38): a random init's BatchNorm is the identity,
    a pre-trained one carries its pre-training data's statistics, and an eval-mode probe credits that
    difference to the features. After this, a backbone whose only change is its BatchNorm statistics
    probes exactly as the random init does."""
    model = copy.deepcopy(backbone)
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    # BatchNorm cannot take a batch of one in training mode: a last chunk of one image is left out
    chunks = (images[i:i + batch_size] for i in range(0, len(images), batch_size))
    inputs = (eval_batch(c.to(device), input_size).to(dtype) for c in chunks if len(c) > 1)
    recompute_bn(model, lambda: inputs, bn_only=True)
    return model.eval()


@torch.no_grad()
def embed(backbone: nn.Module, images: Tensor, input_size: int, batch_size: int = 256) -> Tensor:
    """L2-normalised features (N, D) of uint8 (N, S, S, 3) ``images`` at ``input_size`` px, eval mode."""
    was_training = backbone.training
    backbone.eval()
    device = next(backbone.parameters()).device
    dtype = next(backbone.parameters()).dtype
    out = [backbone(eval_batch(images[i:i + batch_size].to(device), input_size).to(dtype)).float()
           for i in range(0, len(images), batch_size)]
    backbone.train(was_training)
    return F.normalize(torch.cat(out), dim=1).cpu()


def knn_predict(train_f: Tensor, train_y: Tensor, test_f: Tensor, n_classes: int, k: int = KNN_K,
                temperature: float = KNN_TEMPERATURE) -> Tensor:
    """Predicted classes (M,) of the test features: a vote of the k most cosine-similar training features,
    each weighted exp(similarity / temperature) (Wu et al. 2018)."""
    sim = test_f @ train_f.T  # (M, N), features are L2-normalised
    top, idx = sim.topk(min(k, len(train_f)), dim=1)  # (M, k)
    votes = torch.zeros(len(test_f), n_classes, dtype=sim.dtype)
    votes.scatter_add_(1, train_y[idx], (top / temperature).exp())
    return votes.argmax(1)


def knn_accuracy(train_f: Tensor, train_y: Tensor, test_f: Tensor, test_y: Tensor, n_classes: int) -> float:
    return float((knn_predict(train_f, train_y, test_f, n_classes) == test_y).double().mean())


def standard_error(accuracy: float, n: int) -> float:
    """Binomial standard error of an accuracy measured on ``n`` test samples, sqrt(p (1 - p) / n): how far
    one checkpoint's figure moves with the draw of its test set alone (509 CIFAR-10 probe images at 27%:
    2.0 points), before any seed's spread."""
    return math.sqrt(accuracy * (1 - accuracy) / n) if n > 0 else float("nan")


def linear_accuracy(train_f: Tensor, train_y: Tensor, test_f: Tensor, test_y: Tensor) -> float:
    """Test accuracy of a multinomial logistic regression (L2, C = 1) on standardised frozen features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train_f.numpy())
    clf = LogisticRegression(max_iter=2000).fit(scaler.transform(train_f.numpy()), train_y.numpy())
    return float(clf.score(scaler.transform(test_f.numpy()), test_y.numpy()))


def probe(backbone: nn.Module, data: ProbeData, input_size: int, linear: bool = True,
          bn: str = "reestimate") -> dict[str, float]:
    """{"knn_acc"} (and {"linear_acc"}) of ``backbone``'s frozen features on ``data``. ``bn="reestimate"``
    (the fair probe) first re-estimates the BatchNorm statistics on ``data``'s training images
    (:func:`reestimate_bn`; ``backbone`` itself is untouched); ``bn="eval"`` embeds with the statistics the
    backbone carries, which credits pre-training data's statistics as if they were features. With
    ``data.folds``, each fold is probed so (BatchNorm re-estimated on the fold's training images) and the
    accuracies pooled over every image."""
    if bn not in BN_MODES:
        raise ValueError(f"bn must be one of {BN_MODES}, got {bn!r}")
    scored = [(_probe_split(backbone, split, input_size, linear, bn), len(split.test_y))
              for split in data.splits()]
    if len(scored) == 1:
        return scored[0][0]
    # folds: the share of all scored images predicted right, each fold weighted by its size
    return {key: sum(acc[key] * n for acc, n in scored) / data.n_scored for key in scored[0][0]}


def _probe_split(backbone: nn.Module, split: ProbeData, input_size: int, linear: bool, bn: str) -> dict:
    if bn == "reestimate":  # on this split's own training images (a fold's, with folds)
        backbone = reestimate_bn(backbone, split.train_x, input_size)
    train_f, test_f = embed(backbone, split.train_x, input_size), embed(backbone, split.test_x, input_size)
    out = {"knn_acc": knn_accuracy(train_f, split.train_y, test_f, split.test_y, split.n_classes)}
    if linear:
        out["linear_acc"] = linear_accuracy(train_f, split.train_y, test_f, split.test_y)
    return out


def effective_rank(features: Tensor, eps: float = 1e-7) -> float:
    """RankMe (Garrido et al., ICML 2023, Eq. 1) of features (N, D): exp of the entropy of the singular
    values normalised to sum 1 (each + eps). Between 1 (all rows on one line) and min(N, D) (a flat
    spectrum); it needs no labels, so it watches pre-training where no natural image is at hand."""
    s = torch.linalg.svdvals(features.double())
    p = s / s.sum().clamp_min(1e-30) + eps
    return float(torch.exp(-(p * p.log()).sum()))


PROBES = {"digits": digits_probe}  # the labelled sets `pretrain --probe` knows (analyze probe: any dataset)
