"""The settings groups of a federated run (issue 39): data, partition, federated training, model and run.

Each group is a frozen dataclass whose fields carry their help, unit, source and range
(:func:`fpsfl.base.settings.setting`); :class:`federated.experiment.FederateConfig` holds one of each and
reads every setting by its flat name as well (``cfg.lr`` is ``cfg.training.lr``), which is the name of its
flag, its key in a TOML file, a Flower run config and ``config.json``. A setting belongs in the group whose
help section shows it; a setting of one dataset or partition belongs in that plugin's file instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fpsfl.base.cli import comma_list
from fpsfl.base.settings import setting

from .algorithms import ALGORITHMS
from .datasets import DATASETS
from .oracle.tracking import TrackConfig
from .partitions import PARTITIONS


def _auto_int(text: str) -> int | None:
    """``--client-batch auto`` (None) or a positive count."""
    return None if text.strip().lower() == "auto" else int(text)


@dataclass(frozen=True)
class DataGroup:
    """The dataset and how its images are loaded (the ``data`` group of --help)."""

    dataset: str = setting("digits", lambda: " | ".join(DATASETS), group="data",
                           default_text="digits, embedded, no download")
    data_root: str | None = setting(None, "folder holding the dataset (docs/federated.md: datasets)",
                                    group="data")
    download: bool = setting(False, "let torchvision download CIFAR (needs a network)", group="data")
    decode: str = setting("auto", "folder images held in memory or decoded from their files batch by batch "
                                  "by DataLoader workers: auto (stream when they would take over half the "
                                  "available memory, and inat-geo always) | memory | stream", group="data",
                          choices=("auto", "memory", "stream"))
    verify: bool = setting(True, "do not check CIFAR's files against their published md5 sums (for a "
                                 "CIFAR-format folder that is not the published data, e.g. the recipes' "
                                 "smoke data)",
                           flag="--no-verify", group="data")
    store_size: int | None = setting(None, "px side images are held at in memory", within="[1, inf)",
                                     group="data", default_text="per dataset")
    input_size: int | None = setting(None, "px side the model sees", within="[1, inf)", group="data",
                                     default_text="32, or 224 for larger data")
    val_fraction: float = setting(0.02, "held-out share of the training set (§4.2: 2% for tuning)",
                                  within="[0, 0.5)", group="data")
    data_args: dict[str, Any] = setting(default_factory=dict, cli=False, group="data")  # every dataset's own
    # settings (split_csv, crop_size, ...), declared in its file, flat in config.json


@dataclass(frozen=True)
class PartitionGroup:
    """How the training set is split into clients, every partition's own settings in ``partition_args``."""

    partition: str | None = setting(None, lambda: " | ".join(PARTITIONS), group="partition",
                                    default_text="natural for datasets with given clients (inat-geo, "
                                                 "cityscapes), else dirichlet")
    clients: int = setting(10, "number of clients (§4.2)", within="[1, inf)", group="partition")
    min_size: int | None = setting(None, "samples every client must have", within="[1, inf)",
                                   group="partition", default_text="10 (NIID-Bench); 1 for natural clients")
    partition_args: dict[str, Any] = setting(default_factory=dict, cli=False)  # every partition's settings


@dataclass(frozen=True)
class TrainingGroup:
    """The FL algorithm and its clients' local training (§4.2, Appendix B.1)."""

    algo: str = setting("fedavg", lambda: " | ".join(ALGORITHMS), group="federated training")
    algo_args: dict[str, Any] = setting(default_factory=dict, cli=False)  # --set overrides
    participation: float = setting(1.0, "fraction of clients a round (§4.2: all)", within="(0, 1]",
                                   group="federated training")
    rounds: int = setting(100, "communication rounds (§4.2)", within="[1, inf)", group="federated training")
    local_epochs: int = setting(5, "local epochs a round (§4.2)", within="[1, inf)",
                                group="federated training")
    lr: float | None = setting(None, "local learning rate", within="(0, inf)", group="federated training",
                               default_text="the dataset's Table-9 preset")
    batch_size: int | None = setting(None, "local batch; at least 2: BatchNorm trains on batch statistics (a "
                                           "client of one sample still trains, docs/reliability.md)",
                                     within="[2, inf)", group="federated training",
                                     default_text="the dataset's Table-9 preset, e.g. 32 for CIFAR")
    optimizer: str | None = setting(None, "local optimiser", choices=("sgd", "adam"),
                                    group="federated training",
                                    default_text="the dataset's preset: adam for cityscapes, sgd otherwise")
    momentum: float = setting(0.9, "local SGD momentum (Appendix B.1)", within="[0, 1)",
                              group="federated training")
    weight_decay: float = setting(1e-4, "local weight decay (Appendix B.1)", within="[0, inf)",
                                  group="federated training")
    lr_decay: float = setting(0.1, "lr factor every --lr-decay-every rounds (Appendix B.1)", within="(0, 1]",
                              group="federated training")
    lr_decay_every: int = setting(30, "rounds between lr decays (Appendix B.1)", within="[1, inf)",
                                  group="federated training")
    bn: str = setting("global", "global: BatchNorm statistics averaged like parameters; local: kept per "
                                "client", choices=("global", "local"), group="federated training")
    client_batch: int | None = setting(None, "clients trained together as one vectorised model (torch.func "
                                             "vmap); 1: one after another", parse=_auto_int,
                                       within="[1, inf)", metavar="K", group="federated training",
                                       default_text="auto: all of a round's clients on a GPU, 1 on a CPU, "
                                                    "where more is refused: it cannot equal 1 there "
                                                    "(docs/performance.md: Vectorised clients)")
    amp: bool = setting(False, "bf16 autocast in local training and evaluation (for a GPU's tensor cores; "
                               "results differ from float32 ones slightly)", group="federated training")
    centralized: bool = setting(False, "train centrally on the union of the clients, rounds x local-epochs "
                                       "epochs (the CL of ΔCL-FL, §4.2)", group="federated training")


@dataclass(frozen=True)
class ModelGroup:
    """The backbone and the weights it starts from."""

    arch: str | None = setting(None, "backbone: see pretrain --help", group="model",
                               default_text="resnet20 at 32 px, resnet18 at 224 px, mobilenet_v2 for "
                                            "cityscapes, as in the paper")
    width: float = setting(1.0, "CIFAR ResNet width multiplier (Fig. 5)", within="(0, inf)", group="model")
    init: str = setting("random", "random | imagenet | places365:FILE (the Places365 project's "
                                  "resnet18_places365.pth.tar) | fps-resnet20 (shipped) | PATH.ckpt from "
                                  "pretrain", group="model")
    init_format: str = setting("fpsfl", "torchvision: --init is a plain state dict (e.g. Places365 weights)",
                               choices=("fpsfl", "torchvision"), group="model")


@dataclass(frozen=True)
class RunGroup:
    """Seed, evaluation and what a run keeps beside its metrics."""

    seed: int = setting(0, "seed of partition, init, sampling and data order", within="[0, inf)", group="run")
    eval_local: bool = setting(True, "skip testing each local model before aggregation (faster; no local_acc "
                                     "metric, which the ΔL/ΔG analysis needs)", flag="--no-eval-local",
                               group="run")
    save_local_models: tuple[int, ...] = setting((), "keep every client's model of these rounds (for "
                                                     "analysis), e.g. 10,50", parse=comma_list(int),
                                                 metavar="R1,R2", within="[1, inf)", group="run")
    tracking: TrackConfig = setting(default_factory=TrackConfig, cli=False)  # per-round analyses (§6.2)
