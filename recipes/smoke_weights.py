"""Stand-ins for the published weight files that ``federate --init`` reads, in their real layouts, for the
recipes' smoke runs and the tests (recipes/smoke_data.py writes them with the datasets): the Places365
project's ResNet18 file and torchvision's ImageNet files under ``$TORCH_HOME``. Random weights: the smoke
runs have no network, and what is tested is the loading, not the features.
"""

from __future__ import annotations

from pathlib import Path


def write_places365(path, seed: int = 0) -> dict:
    """The Places365 project's ``resnet18_places365.pth.tar`` as published: ``{"epoch", "arch",
    "state_dict", "best_prec1"}``, the state of a torchvision ResNet18 with a 365-way fc saved under
    DataParallel's ``module.`` prefix, in torch's legacy (pre-1.6, non-zip) file format. Returns the plain
    state (no prefix)."""
    import torch
    from torchvision.models import resnet18

    torch.manual_seed(seed)
    state = resnet18(num_classes=365).state_dict()
    record = {"epoch": 90, "arch": "resnet18", "state_dict": {f"module.{k}": v for k, v in state.items()},
              "best_prec1": 54.74}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, path, _use_new_zipfile_serialization=False)
    return state


def write_torch_hub(hub_checkpoints, seed: int = 0) -> None:
    """Stand-ins for torchvision's ImageNet weight files, at the names ``federate --init imagenet`` looks up
    in ``$TORCH_HOME/hub/checkpoints/`` (random weights in the published state-dict layout: the smoke runs
    have no network)."""
    import torch
    from torchvision.models import mobilenet_v2, resnet18

    from federated.initialisation import IMAGENET_FILES

    torch.manual_seed(seed)
    folder = Path(hub_checkpoints)
    folder.mkdir(parents=True, exist_ok=True)
    for arch, build in (("resnet18", resnet18), ("mobilenet_v2", mobilenet_v2)):
        torch.save(build().state_dict(), folder / IMAGENET_FILES[arch].rsplit("/", 1)[1])
