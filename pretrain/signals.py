"""Signals that tell whether pre-training moved the backbone at all (Milestone 5, issue 38).

Under BatchNorm a conv layer's output does not depend on its weight's scale, so weight decay alone shrinks
the weights without changing the function, and a run whose gradients added nothing lasting ends with a
backbone that is its random init, rescaled (Wan et al., NeurIPS 2021, "spherical motion dynamics"). What
counts is the direction: per stage, the cosine between the weights and the initial weights, and the norm
ratio that tells weight decay's shrink apart from learning. Pure functions on state dicts; the training
loop, ``analyze probe`` and ``federate --init`` read them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Above this cosine to init, the deepest stage has barely turned: the checkpoint is its random init
# (issue 38: the withdrawn FPS weights sat at 0.9997-0.9998).
MOVED_COS = 0.99
_GROUPED = ("stages", "features", "blocks", "layers")  # timm / torchvision containers of numbered stages


def stage_of(name: str) -> str:
    """The stage a parameter belongs to: its top-level module (``conv1``, ``layer3``), or the numbered
    child of a container of stages (timm's ``stages.2``, MobileNetV2's ``features.5``)."""
    parts = name.split(".")
    if parts[0] in _GROUPED and len(parts) > 2 and parts[1].isdigit():
        return ".".join(parts[:2])
    return parts[0]


def _is_conv_weight(name: str, value: Tensor) -> bool:
    """A conv or linear weight (ndim >= 2): the weights BatchNorm makes scale-free."""
    return name.endswith("weight") and value.ndim >= 2 and value.is_floating_point()


def deepest_stage(names: list[str], values: list[Tensor]) -> str:
    """The deepest stage of a backbone: the stage of its last conv or linear weight, the one whose cosine
    to init :func:`verdict` reads."""
    stages = [stage_of(n) for n, v in zip(names, values, strict=True) if _is_conv_weight(n, v)]
    if not stages:
        raise ValueError("no conv or linear weight: the backbone has no stage to name")
    return stages[-1]


def _weights(state: dict[str, Tensor]) -> dict[str, list[Tensor]]:
    """Conv and linear weights per stage, in order."""
    stages: dict[str, list[Tensor]] = {}
    for name, value in state.items():
        if _is_conv_weight(name, value):
            stages.setdefault(stage_of(name), []).append(value.detach().double().flatten().cpu())
    return stages


def weight_drift(init: dict[str, Tensor], now: dict[str, Tensor]) -> dict[str, dict[str, float]]:
    """Per stage: ``cos``, the cosine between the stage's weights (all its conv/linear weights as one
    vector) and the initial ones, and ``norm``, the ratio of their norms. A cosine of 1 with a norm below 1
    is weight decay alone. Stages in the order the state dict lists them (the deepest last)."""
    before, after = _weights(init), _weights(now)
    if list(before) != list(after):
        raise ValueError(f"the two states have different stages: {list(before)} vs {list(after)}")
    out = {}
    for stage, vectors in after.items():
        w, w0 = torch.cat(vectors), torch.cat(before[stage])
        if w.shape != w0.shape:
            raise ValueError(f"stage {stage}: {tuple(w.shape)} weights vs {tuple(w0.shape)} at init")
        n, n0 = float(w.norm()), float(w0.norm())
        cos = float(w @ w0) / max(n * n0, 1e-300)
        out[stage] = {"cos": cos, "norm": n / max(n0, 1e-300)}
    return out


def deepest_cos(drift: dict[str, dict[str, float]]) -> float:
    """The cosine to init of the deepest stage (the last one listed)."""
    return list(drift.values())[-1]["cos"] if drift else math.nan


def flat(drift: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{"cos_init/layer3": ..., "norm_ratio/layer3": ...}``: metrics.jsonl / TensorBoard keys."""
    out = {}
    for stage, values in drift.items():
        out[f"cos_init/{stage}"] = values["cos"]
        out[f"norm_ratio/{stage}"] = values["norm"]
    return out


def unflat(record: dict) -> dict[str, dict[str, float]]:
    """The inverse of :func:`flat` on a metrics line (other keys ignored)."""
    drift: dict[str, dict[str, float]] = {}
    for key, value in record.items():
        if key.startswith("cos_init/"):
            drift.setdefault(key[len("cos_init/"):], {})["cos"] = float(value)
        elif key.startswith("norm_ratio/"):
            drift.setdefault(key[len("norm_ratio/"):], {})["norm"] = float(value)
    return drift


def verdict(drift: dict[str, dict[str, float]], threshold: float = MOVED_COS) -> str | None:
    """None when the deepest stage moved; else the one line saying the checkpoint is not pre-trained."""
    if not drift:
        return None
    stage, values = list(drift.items())[-1]
    if values["cos"] <= threshold:
        return None
    return (f"not pre-trained in any useful sense: the deepest stage ({stage}) kept cosine "
            f"{values['cos']:.4f} to its random init (norm x{values['norm']:.3f}), above {threshold}: it is "
            f"its random init, rescaled")


def summary(drift: dict[str, dict[str, float]]) -> str:
    """``conv1 0.912 (x0.81), layer1 ...``: cosine to init and norm ratio per stage, one line."""
    return ", ".join(f"{s} {v['cos']:.3f} (x{v['norm']:.2f})" for s, v in drift.items())


def centred_rank(features: Tensor, eps: float = 1e-7) -> float:
    """RankMe (Garrido et al., ICML 2023, Eq. 1) of the centred features (N, D): the mean is removed first,
    so a shared offset (ReLU features' large mean direction) does not count as one dimension of the
    spectrum and a batch of identical rows has rank ~1 however large their mean."""
    from .probe import effective_rank

    x = features.double()
    return effective_rank(x - x.mean(0, keepdim=True), eps)


@torch.no_grad()
def scale_weights(model: torch.nn.Module, factor: float) -> None:
    """Multiply every conv/linear weight (ndim >= 2) of ``model`` by ``factor`` in place: the down-scaled
    init of ``pretrain --init-scale``. Behind BatchNorm the function is unchanged (up to BatchNorm's eps)."""
    for name, p in model.named_parameters():
        if _is_conv_weight(name, p):
            p.mul_(factor)


def initial_state(arch: str, width: float, seed: int, scale: float = 1.0) -> dict[str, Tensor]:
    """The weights ``pretrain`` starts from for this seed (:func:`pretrain.train.build_method` seeds torch
    with the run's seed, then builds the backbone first, then scales it by ``--init-scale``)."""
    from .backbones import create_backbone

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_backbone(arch, width)
    scale_weights(model, scale)
    return model.state_dict()


def checkpoint_drift(ckpt: dict) -> dict[str, dict[str, float]] | None:
    """A checkpoint's drift from its init: the one it records (``signals.drift``, written by ``pretrain``
    since issue 38), else recomputed for a ``pretrain`` checkpoint from its seed; None when neither is
    possible (a checkpoint of another maker that does not record its init)."""
    recorded = (ckpt.get("signals") or {}).get("drift")
    if isinstance(recorded, dict) and recorded:
        return recorded
    recipe = (ckpt.get("config") or {}).get("pretrain", {})
    seed, scale = recipe.get("seed"), recipe.get("init_scale", 1.0)
    if not isinstance(seed, int) or not isinstance(scale, int | float):
        return None
    return weight_drift(initial_state(ckpt["arch"], ckpt["width"], seed, float(scale)), ckpt["backbone"])
