"""Typed configuration of a federated run, with the defaults of Chen et al., ICLR 2023 (§4.2, Table 9).

The default setting is the paper's: 10 clients, Dir(alpha = 0.3), full participation, 5 local epochs,
100 rounds, SGD with momentum 0.9 and weight decay 1e-4, learning rate x0.1 every 30 rounds. Learning rate
and batch size come from a per-dataset preset (Table 9) unless given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from fpsfl.base.settings import coerce

from .algorithms import ALGORITHMS, AlgoConfig
from .oracle.tracking import TrackConfig


class Preset(NamedTuple):
    lr: float
    batch_size: int
    optimizer: str  # sgd (momentum, weight decay) | adam
    algos: dict[str, dict[str, Any]] = {}  # algorithm settings this dataset changes (below --set); read-only


# Table 9: local optimiser, learning rate and batch size per dataset
PRESETS: dict[str, Preset] = {
    "cifar10": Preset(0.01, 32, "sgd", {"moon": {"mu": 5.0}}),  # MOON's own CIFAR-10 mu (Li et al. 2021)
    "cifar100": Preset(0.01, 32, "sgd"),
    "tinyimagenet": Preset(0.01, 32, "sgd"), "inat-geo": Preset(0.1, 128, "sgd"),
    "imagefolder": Preset(0.01, 32, "sgd"), "cityscapes": Preset(0.001, 16, "adam"),
    # Not in the paper. A digits client holds ~140 images, so batch 32 would give ~4 local steps a round;
    # batch 8 and lr 0.02 were picked by a small sweep on digits (lr 0.01-0.1, batch 8-32).
    "digits": Preset(0.02, 8, "sgd"),
}
_FALLBACK = Preset(0.01, 32, "sgd")


@dataclass(frozen=True)
class FederateConfig:
    # data
    dataset: str = "digits"  # embedded default; cifar10 | cifar100 | tinyimagenet | inat-geo | imagefolder
    data_root: str | None = None
    download: bool = False
    split_csv: str | None = None  # inat-geo client split
    store_size: int | None = None  # px images are held at; None: the dataset's default
    input_size: int | None = None  # px the model sees; None: the dataset's default (32, or 224 above)
    val_fraction: float = 0.02  # §4.2: 2% of the training set held out for tuning
    # partition
    partition: str = "dirichlet"
    clients: int = 10  # §4.2 default setting
    alpha: float = 0.3  # §4.2 default setting: Dir(0.3)
    labels_per_client: int = 2  # shards: #C = k (NIID-Bench)
    beta: float = 0.5  # quantity skew Dir(beta) (NIID-Bench)
    noise: float = 0.1  # noise partition: client i gets sigma * i / N, [0, 1] pixel units (NIID-Bench)
    min_size: int | None = None  # samples per client at least; None: 10 (NIID-Bench), 1 for natural clients
    # federated training
    algo: str = "fedavg"
    algo_args: dict[str, Any] = field(default_factory=dict)  # --set overrides of the algorithm's config
    participation: float = 1.0  # fraction of clients per round (§4.2 default: all)
    rounds: int = 100  # §4.2
    local_epochs: int = 5  # §4.2
    lr: float | None = None  # None: the dataset preset (Table 9)
    batch_size: int | None = None  # None: the dataset preset (Table 9)
    optimizer: str | None = None  # sgd | adam; None: the dataset preset (Table 9: Adam for Cityscapes)
    momentum: float = 0.9  # Appendix B.1
    weight_decay: float = 1e-4  # Appendix B.1
    lr_decay: float = 0.1  # multiplied every lr_decay_every rounds (Appendix B.1)
    lr_decay_every: int = 30  # rounds (Appendix B.1)
    bn: str = "global"  # global: BatchNorm statistics averaged like parameters; local: kept per client
    centralized: bool = False  # train on the union of the clients instead (the CL baseline of ΔCL-FL)
    # model
    arch: str = "resnet20"  # §4.2: ResNet20 at 32 px, ResNet18 at 224 px
    width: float = 1.0
    init: str = "random"  # random | imagenet | a pretrain checkpoint path
    init_format: str = "fpsfl"  # fpsfl | torchvision (a plain state dict, e.g. Places365)
    crop_size: int | None = None  # segmentation: px of the square training crops (paper: 768)
    eval_size: str | None = None  # segmentation: "HxW" test resolution; None: as stored (paper: 1024x2048)
    seed: int = 0
    eval_local: bool = True  # also test each local model before aggregation (the ΔL/ΔG analysis needs it)
    save_local_models: tuple[int, ...] = ()  # rounds whose client models are kept for analysis
    tracking: TrackConfig = field(default_factory=TrackConfig)  # per-round analyses (§6.2)

    def __post_init__(self) -> None:
        checks = {
            f"unknown algorithm {self.algo!r}; choose from {', '.join(ALGORITHMS)}": self.algo in ALGORITHMS,
            f"--participation must lie in (0, 1], got {self.participation}": 0 < self.participation <= 1,
            f"--alpha must be positive, got {self.alpha}": self.alpha > 0,
            f"--beta must be positive, got {self.beta}": self.beta > 0,
            f"--bn must be global or local, got {self.bn!r}": self.bn in ("global", "local"),
            f"--init-format must be fpsfl or torchvision, got {self.init_format!r}":
                self.init_format in ("fpsfl", "torchvision"),
            "--val-fraction must lie in [0, 0.5)": 0 <= self.val_fraction < 0.5,
            f"--optimizer must be sgd or adam, got {self.optimizer!r}":
                self.optimizer in (None, "sgd", "adam"),
            "--convex-data val needs a validation split; set --val-fraction above 0":
                self.tracking.data != "val" or self.val_fraction > 0,
        }
        checks.update({
            f"--lr-decay must lie in (0, 1], got {self.lr_decay}": 0 < self.lr_decay <= 1,
            f"--momentum must lie in [0, 1), got {self.momentum}": 0 <= self.momentum < 1,
            f"--weight-decay must be >= 0, got {self.weight_decay}": self.weight_decay >= 0,
            f"--noise must be >= 0, got {self.noise}": self.noise >= 0,
            f"--labels-per-client must be >= 1, got {self.labels_per_client}": self.labels_per_client >= 1,
            f"--min-size must be >= 1, got {self.min_size}": self.min_size is None or self.min_size >= 1,
            f"--width must be positive, got {self.width}": self.width > 0,
            f"--seed must be >= 0, got {self.seed}": self.seed >= 0,
            f"--save-local-models rounds must lie in 1..{self.rounds}, got {list(self.save_local_models)}":
                all(1 <= r <= self.rounds for r in self.save_local_models),
        })
        for name in ("clients", "rounds", "local_epochs", "lr_decay_every"):
            checks[f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}"] = (
                getattr(self, name) > 0)
        for name in ("store_size", "input_size", "crop_size"):
            value = getattr(self, name)
            checks[f"--{name.replace('_', '-')} must be positive, got {value}"] = value is None or value > 0
        for message, ok in checks.items():
            if not ok:
                raise ValueError(message)
        if (self.lr is not None and self.lr <= 0) or (self.batch_size is not None and self.batch_size <= 0):
            raise ValueError("--lr and --batch-size must be positive")
        self.algo_config()

    def algo_config(self) -> AlgoConfig:
        """The algorithm's config: its defaults, then the dataset preset's, then ``algo_args`` (--set)."""
        cls = ALGORITHMS[self.algo].Config
        known = {f.name for f in fields(cls)}
        values = {}
        for key, value in {**self.preset().algos.get(self.algo, {}), **self.algo_args}.items():
            if key not in known:
                raise ValueError(f"{self.algo} has no setting {key!r}"
                                 + (f"; it has {', '.join(sorted(known))}" if known else "; it has none"))
            values[key] = coerce(key, value, type(getattr(cls(), key)))
        return cls(**values)

    def preset(self) -> Preset:
        return PRESETS.get(self.dataset, _FALLBACK)

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else self.preset().lr

    def resolved_batch(self) -> int:
        return self.batch_size if self.batch_size is not None else self.preset().batch_size

    def resolved_optimizer(self) -> str:
        return self.optimizer or self.preset().optimizer

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FederateConfig:
        """The config a run directory's ``config.json`` holds (its ``to_dict``), rebuilt."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        tracking = dict(values.pop("tracking", {}))
        tracking["track"] = tuple(tracking.get("track", ()))
        values["save_local_models"] = tuple(values.get("save_local_models", ()))
        return cls(**values, tracking=TrackConfig(**tracking))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "lr": self.resolved_lr(), "batch_size": self.resolved_batch(),
                "optimizer": self.resolved_optimizer()}
