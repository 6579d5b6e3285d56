"""MoCo-v2 (Chen, Fan, Girshick & He 2020) on FPS pairs: Chen et al., ICLR 2023, §4.2 and Appendix A.2.

The query encoder (backbone + 2-layer MLP head, f -> f -> 128 as the official FPS code, f the backbone's
feature width; ``heads=imagenet``: 2048 wide) embeds view 1; a momentum copy embeds view 2 as the positive
key. Negatives are the 65,536 most recent keys in a memory bank; the loss is InfoNCE with temperature 0.2. As
in the MoCo reference the loss is not symmetrised (``symmetric``: each view is also a query against the
other's key, as MoCo v3, Chen, Xie & He 2021). The heads, the bank's buffers and the momentum update come from
lightly; the InfoNCE is :func:`info_nce`, equal to lightly's ``NTXentLoss`` with a bank (tested) but reading
nothing back to the host (issue 40); the checkpoint keeps the query encoder (``keep=key``: the momentum
encoder).

Under torchrun (He et al. 2020, §3.3, "Shuffling BN"), as the MoCo reference: the key batch is gathered from
all processes, permuted by one permutation shared by all, and each process encodes its share, so a key's
BatchNorm statistics come from other samples than its query's (BN would otherwise leak which key is the
positive); the keys are unshuffled after. Each process's loss reads the same bank, and the bank is updated
with the keys of all processes concatenated in rank order, so it holds what one process would hold. BN
statistics stay per process by design (no SyncBatchNorm), so the loss is not that of one process.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from lightly.models.modules import MoCoProjectionHead
from lightly.models.modules.heads import ProjectionHead
from lightly.models.modules.memory_bank import MemoryBankModule
from lightly.models.utils import (
    batch_shuffle_distributed,
    batch_unshuffle_distributed,
    concat_all_gather,
    deactivate_requires_grad,
    update_momentum,
)
from torch import Tensor, nn

from fpsfl.base.settings import setting

from ..distributed import world_size
from . import METHODS
from .base import HEADS, IMAGENET_HIDDEN, Method, ViewsConfig, feature_std, filled


def info_nce(q: Tensor, k: Tensor, negatives: Tensor, temperature: float,
             valid: Tensor | None = None) -> Tensor:
    """MoCo's InfoNCE (He et al. 2020, eq. 1): queries q (B, D) against their positive keys k (B, D) and the
    bank's negatives (K, D), all compared by cosine; the positive's logit first, the mean over the batch.
    ``negatives`` are unit vectors already (the bank holds normalised keys). ``valid`` (K,) bool: the
    negatives that count (None: all); the others leave the softmax, static shapes kept."""
    q, k = F.normalize(q, dim=1), F.normalize(k, dim=1)
    against = q @ negatives.T
    if valid is not None:
        against = against.masked_fill(~valid, float("-inf"))
    logits = torch.cat(((q * k).sum(1, keepdim=True), against), 1) / temperature
    return (torch.logsumexp(logits, 1) - logits[:, 0]).mean()


def uniformity(x: Tensor, t: float = 2.0) -> Tensor:
    """Wang & Isola (ICML 2020, "Understanding contrastive representation learning through alignment and
    uniformity on the hypersphere", eq. 5): the log of the mean Gaussian potential exp(-t |x_i - x_j|^2)
    over the batch's ordered pairs i != j of the l2-normalised rows of x (B, D); lowest when the rows spread
    evenly over the sphere. The diagonal leaves by a -inf mask (static shapes, no host sync)."""
    x = F.normalize(x.float(), dim=1)
    potential = -t * (2 - 2 * (x @ x.T)).clamp(min=0)
    eye = torch.eye(len(x), dtype=torch.bool, device=x.device)
    pairs = len(x) * (len(x) - 1)
    return torch.logsumexp(potential.masked_fill(eye, float("-inf")).flatten(), 0) - math.log(pairs)


def in_groups(f, x: Tensor, groups: int, interleave: bool = False) -> Tensor:
    """f over ``groups`` groups of x's rows, each its own BatchNorm batch, the outputs back in x's order:
    shuffled BN emulated on one process (He et al. 2020, §3.3: the MoCo reference trains batch 256 on 8
    GPUs, 32 samples a BN batch; Chen et al. 2023 pre-trained at 32 px on one 2080 Ti, one BN batch).
    Contiguous blocks, or with ``interleave`` the rows of each residue mod ``groups``, so that a key's
    group shares about 1/groups of its query's group and BN cannot mark the positive. A group keeps at
    least two rows (BN's batch statistics need two): a short last batch is split into fewer groups.
    Deterministic, static shapes: no RNG, no host sync."""
    groups = min(groups, len(x) // 2)
    if groups <= 1:
        return f(x)
    if not interleave:
        return torch.cat([f(part) for part in x.tensor_split(groups)])
    order = torch.argsort(torch.arange(len(x), device=x.device) % groups, stable=True)
    out = torch.cat([f(part) for part in x[order].tensor_split(groups)])
    return out[torch.argsort(order)]


class KeyBank(MemoryBankModule):
    """lightly's memory bank (its buffers, their random init and the checkpoint's ``bank``/``bank_ptr``) with
    its write position kept on the device. lightly reads ``int(bank_ptr)`` at every update, which makes the
    host wait for the device once a step and bakes the position into a captured CUDA graph (issue 40);
    here the writes are indexed from the buffer itself, with lightly's result.

    ``empty``: the bank starts with no keys instead of lightly's (and the MoCo reference's) random unit
    vectors; ``filled`` counts the rows written (from row 0, on the device), and :meth:`valid` masks the rest
    out of the loss. A full bank is lightly's bank (``filled`` is K from the start when not ``empty``)."""

    def __init__(self, size: tuple[int, int], gather_distributed: bool, empty: bool = False):
        super().__init__(size=size, gather_distributed=gather_distributed)
        self.empty = empty
        self.register_buffer("filled", torch.full((1,), 0 if empty else size[0], dtype=torch.long),
                             persistent=False)

    def valid(self) -> Tensor | None:
        """(K,) bool, the rows holding keys; None when the bank started full (every row counts)."""
        if not self.empty:
            return None
        return torch.arange(self.size[0], device=self.bank.device) < self.filled

    def negatives(self) -> Tensor:
        """The bank as it is now (K, D), a copy: the update that follows must not change the loss's
        saved tensors."""
        return self.bank.detach().clone()

    def push(self, keys: Tensor) -> None:
        """Write the keys (of every process, in rank order) over the oldest; as lightly, a batch that
        reaches the bank's end fills it and the rest is dropped, and the position wraps to 0. Static
        shapes: the rows past the end are written at their wrapped index with the value already there, which
        no kept key shares (at most K keys are written)."""
        if self.gather_distributed and world_size() > 1:
            keys = concat_all_gather(keys)
        size = self.size[0]
        keys = keys.detach()[:size]
        ptr = self.bank_ptr
        at = ptr + torch.arange(len(keys), device=keys.device)
        index = at.remainder(size)
        rows = torch.where((at < size).unsqueeze(1), keys.to(self.bank.dtype), self.bank[index])
        self.bank.index_copy_(0, index, rows)
        self.bank_ptr.copy_(torch.where(ptr + len(keys) >= size, torch.zeros_like(ptr), ptr + len(keys)))
        self.filled.copy_((self.filled + len(keys)).clamp(max=size))


@dataclass(frozen=True)
class MoCoV2Config(ViewsConfig):
    lr: float = setting(0.03, "per 256 samples (MoCo-v2: 0.03 at batch 256), scaled linearly",
                        within="(0, inf)")
    heads: str = setting("official", "head sizes: official (the FPS code's main_moco.py: an MLP as wide as "
                                     "the backbone's features) or imagenet (MoCo-v2: 2048 wide)",
                         choices=HEADS)
    hidden_dim: int | None = setting(None, "MLP head hidden width (default: the backbone's feature width, "
                                           "official; 2048, imagenet)", within="[1, inf)")
    out_dim: int = setting(128, "key/query dimension (MoCo-v2)", within="[1, inf)")
    head_layers: int = setting(2, "linear layers of the MLP head, a ReLU between each (MoCo-v2: 2; MoCo v3 "
                                  "and SimCLR v2: 3): a deeper head takes on more of the loss's invariances, "
                                  "so that the backbone's last stage stays more general (Bordes et al. 2023, "
                                  "'Guillotine regularization'); an experiment of issue 38, "
                                  "docs/pretraining.md", within="[2, inf)")
    head_bn: bool = setting(False, "BatchNorm after the head's hidden layer (SimCLR's projector; MoCo-v2 and "
                                   "the FPS code have none): an experiment of issue 38, see "
                                   "docs/pretraining.md")
    bank_size: int = setting(65_536, "keys in the memory bank (MoCo: K = 65,536)", within="[1, inf)")
    temperature: float = setting(0.2, "InfoNCE temperature (MoCo-v2)", within="(0, inf)")
    key_momentum: float = setting(0.999, "momentum of the key encoder (MoCo: m = 0.999)", within="[0, 1)")
    bank_start: str = setting("random", "what the memory bank holds before the first keys: random (unit "
                                        "vectors, as the MoCo reference and lightly) or empty (negatives "
                                        "only from keys written so far): issue 38, docs/pretraining.md",
                              choices=("random", "empty"))
    feature_uniformity: float = setting(0.0, "weight of the uniformity loss (Wang & Isola 2020) on the "
                                             "backbone's l2-normalised features, added to InfoNCE: an "
                                             "experiment of issue 38 against the features' shared "
                                             "direction, docs/pretraining.md; 0: MoCo-v2",
                                        within="[0, inf)")
    symmetric: bool = setting(False, "each view is also the query of the other's key (MoCo v3's "
                                     "symmetrised loss; the mean of the two directions, so the lr keeps its "
                                     "meaning, and both key sets enter the bank): twice the backbone's work "
                                     "from each pair, an experiment of issue 38, docs/pretraining.md; "
                                     "false: MoCo-v2")
    bn_splits: int = setting(1, "BatchNorm batches each step's batch is split into on one process, the "
                                "keys' groups interleaved against the queries' (shuffled BN, He et al. "
                                "2020 §3.3, emulated: without it BN can mark the positive key; the MoCo "
                                "reference trains batch 256 on 8 GPUs, 32 a BN batch): an experiment of "
                                "issue 38, docs/pretraining.md; 1: one BN batch, as the FPS paper's one "
                                "2080 Ti at 32 px (Chen et al. 2023, App. C)",
                             within="[1, inf)")
    keep: str = setting("query", "the encoder the checkpoint keeps: query (the MoCo reference) or key (its "
                                 "momentum average, as BYOL's and DINO's target): docs/pretraining.md",
                        choices=("query", "key"))

    def resolve(self, feature_dim: int, size: int = 32) -> MoCoV2Config:
        return filled(self, hidden_dim=IMAGENET_HIDDEN if self.heads == "imagenet" else feature_dim)


def _head(feature_dim: int, cfg: MoCoV2Config) -> nn.Module:
    """MoCo-v2's MLP head (lightly's), f -> hidden (-> hidden ...) -> out with a ReLU after each hidden
    layer, ``head_layers`` linear layers in all; with ``head_bn`` a BatchNorm before each ReLU, which removes
    the batch's shared feature offset before the head (post-ReLU features of a random init share a
    direction: mean pairwise cosine about 0.9 on the CIFAR-10 probe set)."""
    if not cfg.head_bn:
        return MoCoProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim, num_layers=cfg.head_layers)
    widths = [feature_dim] + [cfg.hidden_dim] * (cfg.head_layers - 1)
    hidden = [(a, b, nn.BatchNorm1d(b), nn.ReLU()) for a, b in zip(widths[:-1], widths[1:], strict=True)]
    return ProjectionHead([*hidden, (cfg.hidden_dim, cfg.out_dim, None, None)])


@METHODS.register
class MoCoV2(Method):
    name = "mocov2"
    Config = MoCoV2Config

    def __init__(self, backbone: nn.Module, cfg: MoCoV2Config, n_classes: int | None = None):
        cfg = cfg.resolve(backbone.feature_dim)  # a no-op when built by the training loop, which resolves
        super().__init__(backbone, cfg)
        self.head = _head(backbone.feature_dim, cfg)
        self.key_backbone, self.key_head = copy.deepcopy(backbone), copy.deepcopy(self.head)
        deactivate_requires_grad(self.key_backbone)
        deactivate_requires_grad(self.key_head)
        bank = (cfg.bank_size, cfg.out_dim)
        # gather_distributed: the bank takes every process's keys, in rank order (a no-op with one process)
        self.bank = KeyBank(size=bank, gather_distributed=True, empty=cfg.bank_start == "empty")

    def forward(self, views: Tensor, labels: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        h, q = self._query(views[0])
        with torch.no_grad():
            k = self._keys(views[1])
        if self.cfg.symmetric:  # view 2 queries view 1's key; both halves see the bank as it was
            q_back = self._query(views[1])[1]
            with torch.no_grad():
                k_back = self._keys(views[0])
            loss = self.loss(torch.cat((q, q_back)), torch.cat((k, k_back)))
        else:
            loss = self.loss(q, k)
        if self.cfg.feature_uniformity:
            loss = loss + self.cfg.feature_uniformity * uniformity(h)
        return loss, {"z_std": feature_std(q)}

    def loss(self, q: Tensor, k: Tensor) -> Tensor:
        """InfoNCE against the bank as it was; then, when q requires grad (training, as lightly), the
        normalised keys k replace the oldest in the bank."""
        loss = info_nce(q, k, self.bank.negatives(), self.cfg.temperature, self.bank.valid())
        if q.requires_grad:
            self.bank.push(F.normalize(k.detach(), dim=1))
        return loss

    def _query(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The query encoder's backbone features and head output for x (B, 3, S, S), in ``bn_splits``
        contiguous BN batches."""
        h = in_groups(self.backbone, x, self.cfg.bn_splits)
        return h, in_groups(self.head, h, self.cfg.bn_splits)

    @torch.no_grad()
    def _keys(self, x: Tensor) -> Tensor:
        """The key encoder's output for x (B, 3, S, S); with several processes through shuffled BN, and
        with ``bn_splits`` in BN groups interleaved against the queries'."""
        def encode(part: Tensor) -> Tensor:
            return in_groups(lambda y: self.key_head(self.key_backbone(y)), part, self.cfg.bn_splits,
                             interleave=True)
        if world_size() == 1:
            return encode(x)
        x, undo = batch_shuffle_distributed(x)
        return batch_unshuffle_distributed(encode(x), undo)

    @torch.no_grad()
    def after_step(self) -> None:
        update_momentum(self.backbone, self.key_backbone, self.cfg.key_momentum)
        update_momentum(self.head, self.key_head, self.cfg.key_momentum)

    def kept_backbone(self) -> nn.Module:
        return self.key_backbone if self.cfg.keep == "key" else self.backbone

    def extra_state(self) -> dict[str, Tensor]:
        bank = self.bank  # non-persistent buffers: not in the state_dict
        return {"bank": bank.bank.detach().clone(), "bank_ptr": bank.bank_ptr.detach().clone(),
                "bank_filled": bank.filled.detach().clone()}

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        self.bank.bank.copy_(state["bank"])
        self.bank.bank_ptr.copy_(state["bank_ptr"])
        # states from before bank_start hold a bank that started full
        self.bank.filled.copy_(state.get("bank_filled", torch.full_like(self.bank.filled, self.bank.size[0])))
