"""Typed configuration of a federated run, with the defaults of Chen et al., ICLR 2023 (§4.2, Table 9).

The default setting is the paper's: 10 clients, Dir(alpha = 0.3), full participation, 5 local epochs,
100 rounds, SGD with momentum 0.9 and weight decay 1e-4, learning rate x0.1 every 30 rounds. Learning rate,
batch size and optimiser come from the dataset's preset (Table 9, declared in the dataset's file), and so do
its default partition and architecture.

Every field carries its help, unit, source and range (:func:`fpsfl.base.settings.setting`): ``federate``'s
flags are generated from them. The partitions' own settings (``--alpha``, ``--labels-per-client``, ...) are
declared in each partition's file, and the datasets' (``--split-csv``, ``--crop-size``) in each dataset's;
:class:`FederateConfig` takes any registered partition's or dataset's settings as keyword arguments, keeps
them in ``partition_args`` and ``data_args`` and writes them flat in ``config.json``, as before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fpsfl.base.cli import comma_list
from fpsfl.base.rundir import RunFlags
from fpsfl.base.settings import check, init_fields, override, setting, typed_overrides, typed_table

from .algorithms import ALGORITHMS, AlgoConfig
from .datasets import DATASETS, DataConfig, DataError, Preset, own_settings
from .datasets import setting_fields as dataset_settings
from .oracle.tracking import TrackConfig
from .partitions import PARTITIONS, PartitionConfig, PartitionError, default_min_size, setting_fields


def _auto_int(text: str) -> int | None:
    """``--client-batch auto`` (None) or a positive count."""
    return None if text.strip().lower() == "auto" else int(text)


@dataclass(frozen=True, init=False)
class FederateConfig:
    # data
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
    # partition
    partition: str | None = setting(None, lambda: " | ".join(PARTITIONS), group="partition",
                                    default_text="natural for datasets with given clients (inat-geo, "
                                                 "cityscapes), else dirichlet")
    clients: int = setting(10, "number of clients (§4.2)", within="[1, inf)", group="partition")
    min_size: int | None = setting(None, "samples every client must have", within="[1, inf)",
                                   group="partition", default_text="10 (NIID-Bench); 1 for natural clients")
    partition_args: dict[str, Any] = setting(default_factory=dict, cli=False)  # every partition's settings
    # federated training
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
    # model
    arch: str | None = setting(None, "backbone: see pretrain --help", group="model",
                               default_text="resnet20 at 32 px, resnet18 at 224 px, mobilenet_v2 for "
                                            "cityscapes, as in the paper")
    width: float = setting(1.0, "CIFAR ResNet width multiplier (Fig. 5)", within="(0, inf)", group="model")
    init: str = setting("random", "random | imagenet | places365:FILE (the Places365 project's "
                                  "resnet18_places365.pth.tar) | fps-resnet20 (shipped) | PATH.ckpt from "
                                  "pretrain", group="model")
    init_format: str = setting("fpsfl", "torchvision: --init is a plain state dict (e.g. Places365 weights)",
                               choices=("fpsfl", "torchvision"), group="model")
    # run
    seed: int = setting(0, "seed of partition, init, sampling and data order", within="[0, inf)", group="run")
    eval_local: bool = setting(True, "skip testing each local model before aggregation (faster; no local_acc "
                                     "metric, which the ΔL/ΔG analysis needs)", flag="--no-eval-local",
                               group="run")
    save_local_models: tuple[int, ...] = setting((), "keep every client's model of these rounds (for "
                                                     "analysis), e.g. 10,50", parse=comma_list(int),
                                                 metavar="R1,R2", within="[1, inf)", group="run")
    tracking: TrackConfig = setting(default_factory=TrackConfig, cli=False)  # per-round analyses (§6.2)

    def __init__(self, **values: Any) -> None:
        """Keyword arguments: the fields, plus any registered partition's settings (``alpha=0.1``), which
        land in ``partition_args``, and any dataset's (``split_csv=...``), which land in ``data_args``;
        None for ``partition`` and ``arch`` means the dataset's default."""
        for table, known in flat_settings().items():
            given = {**values.pop(table, {}), **{k: values.pop(k) for k in list(values) if k in known}}
            values[table] = {k: given.get(k, f.default) for k, f in known.items()} | given
        init_fields(self, values)
        spec = DATASETS.lookup(self.dataset, DataError)
        if self.partition is None:
            object.__setattr__(self, "partition", spec.default_partition)
        if self.arch is None:
            object.__setattr__(self, "arch", spec.default_arch)
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        """A partition's or dataset's setting (``cfg.alpha``, ``cfg.crop_size``), including one a plugin
        registered after this was built."""
        if name.startswith("__") or name in ("partition_args", "data_args"):
            raise AttributeError(name)
        for table, known in flat_settings().items():
            if name in known:
                return getattr(self, table).get(name, known[name].default)
        raise AttributeError(f"{type(self).__name__} has no field, partition setting or dataset setting "
                             f"{name!r}")

    def __post_init__(self) -> None:
        ALGORITHMS.lookup(self.algo)
        PARTITIONS.lookup(self.partition, PartitionError)
        check(self)
        if self.save_local_models and max(self.save_local_models) > self.rounds:
            raise ValueError(f"--save-local-models rounds must lie in 1..{self.rounds}, got "
                             f"{list(self.save_local_models)}")
        if self.tracking.data == "val" and self.val_fraction <= 0:
            raise ValueError("--convex-data val needs a validation split; set --val-fraction above 0")
        self.partition_config()
        # typed, and kept typed: --set mu=0.01, --set mu=0.010 and a file's mu = 0.01 are one setting (a run
        # started with one resumes with another, and config.json records the number, not its text)
        self.algo_config()  # the preset's settings and these together
        object.__setattr__(self, "algo_args", typed_algo_args(self.algo, self.algo_args))
        for name in DATASETS:  # every dataset's settings checked, as every partition's are
            own_settings(DataConfig(name, options=self.data_args))

    def partition_config(self) -> PartitionConfig:
        """The partition request of this run (validates the partitions' settings), built once: every
        client of every round reads its noise from it (:func:`federated.rounds.client_noise_for`)."""
        built = self.__dict__.get("_partition_config")
        if built is None:  # immutable config, so the request never changes; not a field (not compared)
            min_size = default_min_size(self.partition) if self.min_size is None else self.min_size
            built = PartitionConfig(name=self.partition, clients=self.clients, min_size=min_size,
                                    seed=self.seed, **self.partition_args)
            object.__setattr__(self, "_partition_config", built)
        return built

    def algo_config(self) -> AlgoConfig:
        """The algorithm's config: its defaults, then the dataset preset's, then ``algo_args`` (--set)."""
        values = {**self.preset().algos.get(self.algo, {}), **self.algo_args}
        return override(ALGORITHMS[self.algo].Config, values, self.algo)

    def preset(self) -> Preset:
        return DATASETS[self.dataset].preset

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else self.preset().lr

    def resolved_batch(self) -> int:
        return self.batch_size if self.batch_size is not None else self.preset().batch_size

    def resolved_optimizer(self) -> str:
        return self.optimizer or self.preset().optimizer

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FederateConfig:
        """The config a run directory's ``config.json`` holds (its ``to_dict``), rebuilt."""
        known = {f.name for f in fields(cls)}.union(*flat_settings().values())
        values = {k: v for k, v in values.items() if k in known}
        tracking = dict(values.pop("tracking", {}))
        tracking["track"] = tuple(tracking.get("track", ()))
        values["save_local_models"] = tuple(values.get("save_local_models", ()))
        return merge({**values, "tracking": tracking})

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config (preset lr, batch and optimiser), partition and dataset settings flat."""
        record = dataclasses.asdict(self)
        for table in flat_settings():
            record.update(record.pop(table))
        return {**record, "lr": self.resolved_lr(),
                "batch_size": self.resolved_batch(), "optimizer": self.resolved_optimizer()}


def typed_algo_args(algo: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (an algorithm's --set settings: text, or typed by a config file) as the algorithm reads
    them; unknown keys and bad types are a one-line ValueError."""
    return typed_overrides(ALGORITHMS.lookup(algo).Config, values, algo)


def typed_record(record: Any) -> Any:
    """A saved ``federate`` table with its ``algo_args`` typed (runs before issue 38's fix recorded --set
    values as text); as it is where this code cannot type them, which then differ, as they should."""
    return typed_table(record, "algo", "algo_args", typed_algo_args)


def flat_settings() -> dict[str, dict[str, dataclasses.Field]]:
    """The plugin settings a FederateConfig takes flat, by the field that holds them: every registered
    partition's (``alpha``) and every dataset's (``split_csv``, ``crop_size``), each declared in its file."""
    return {"partition_args": setting_fields(), "data_args": dataset_settings()}


def merge(*layers: Mapping[str, Any]) -> FederateConfig:
    """The one way settings become a :class:`FederateConfig` (issue 39). Every entry point gives its values,
    typed by its own reader, as layers, later ones winning: ``federate`` its --config file's then its flags,
    a Flower run config, a run's ``config.json`` record, self-pre-training its flags. A layer holds fields
    and partition settings by name, and two groups merged key by key: ``tracking`` (TrackConfig's fields)
    and ``algo_args`` (the algorithm's settings), which are dropped when a later layer picks another
    ``algo`` than the one the layer names (a file's FedProx mu does not reach a run told --algo scaffold)."""
    final = next((layer["algo"] for layer in reversed(layers) if layer.get("algo") is not None), None)
    values: dict[str, Any] = {}
    algo_args: dict[str, Any] = {}
    tracking: dict[str, Any] = {}
    for layer in layers:
        layer = dict(layer)
        own = layer.pop("algo_args", None) or {}
        tracking.update(layer.pop("tracking", None) or {})
        if layer.get("algo") in (None, final):
            algo_args.update(own)
        values.update(layer)
    return FederateConfig(**values, algo_args=algo_args, tracking=TrackConfig(**tracking))


@dataclass(frozen=True)
class RunOptions(RunFlags):
    out: Path | None = setting(None, "run directory: config.json, metrics.jsonl, partition.json/.png, "
                                     "state.pt, final.pt", parse=Path, group="run",
                               default_text="runs/<dataset>-<partition>-<algo>-s<seed>")
    engine: str = setting("inprocess", "inprocess: every client in this process; flower: each client a "
                                       "Flower ClientApp in Flower's simulation engine (Beutel et al. 2020; "
                                       "needs pip install -e '.[flower]'; --client-batch is 1 there)",
                          choices=("inprocess", "flower"), group="run")
    flower_resources: str = setting("num_cpus=1,num_gpus=0", "--engine flower: what each simulated client "
                                                             "holds (Ray client_resources)", metavar="K=V,..",
                                    group="run")
    flower_timeout: float | None = setting(None, "--engine flower: seconds a round waits for its clients' "
                                                 "replies; a client without one ends the run in one line "
                                                 "(--resume continues it)", within="(0, inf)", metavar="S",
                                           group="run", default_text="no limit")
    min_replies: str = setting("1.0", "--engine flower: the replies a round needs, a count N or a fraction F "
                                      "of its clients (0.8: 8 of 10, rounded up); with enough the round "
                                      "aggregates over the clients that replied (their FedAvg weights "
                                      "renormalised) and metrics.jsonl names the missing ones; with fewer "
                                      "the run ends in one line (--resume continues it)", metavar="N|F",
                               group="run", default_text="1.0: every client")
    shards: Path | None = setting(None, "flwr run . on a SuperLink whose SuperNodes hold node-local shards "
                                        "(node config data-dir): the federate export-partitions directory "
                                        "they came from; the server checks that its manifest is this run's "
                                        "partition and every reply's shard sha256 against it", parse=Path,
                                  metavar="DIR", group="run", default_text="none: nodes draw their partition")
    node_names: str | None = setting(
        None, "flwr run . on a SuperLink with --enable-supernode-auth: the names its SuperNodes were "
              "registered with (flwr supernode register --name), client i's the i-th of a comma-separated "
              "list or NAME-{i}; a client is then served only by the node registered under its name, and a "
              "node that claims another's partition-id is left out", metavar="NAMES", group="run",
        default_text="none: a node serves the partition-id it reports")
    node_wait: float = setting(600.0, "--engine flower: seconds the first round waits for every client's "
                                      "node to be online (later rounds go on with --min-replies)",
                               within="(0, inf)", metavar="S", group="run")
    log_rounds: bool = setting(False, cli=False)  # a line per round (flwr run: no bar; visible in flwr log)

    def __post_init__(self) -> None:
        check(self)
        flower_resources(self.flower_resources)
        needed_replies(self.min_replies, 1)


def needed_replies(spec: str, selected: int) -> int:
    """How many of a round's ``selected`` clients must reply under ``--min-replies spec``: an integer is a
    count (at most ``selected``), a number with a point or in (0, 1) a fraction, rounded up (at least 1)."""
    text = str(spec).strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"--min-replies expects a count N or a fraction in (0, 1], got {text!r}")
    fraction = "." in text or "e" in text.lower() or 0 < value < 1
    if fraction and not 0 < value <= 1:
        raise ValueError(f"--min-replies: a fraction must be in (0, 1], got {text}")
    if not fraction and (value < 1 or value != int(value)):
        raise ValueError(f"--min-replies: a count must be a whole number >= 1, got {text}")
    need = math.ceil(value * selected - 1e-9) if fraction else int(value)
    return max(1, min(need, selected))


def flower_resources(text: str) -> dict[str, float]:
    """``num_cpus=1,num_gpus=0.5`` as Ray's client_resources; a ValueError names what is wrong."""
    resources = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in ("num_cpus", "num_gpus"):
            raise ValueError(f"--flower-resources expects num_cpus=N,num_gpus=G, got {pair!r}")
        try:
            resources[key] = float(value)
        except ValueError:
            raise ValueError(f"--flower-resources {key}: {value.strip()!r} is not a number") from None
        if not resources[key] >= (1e-9 if key == "num_cpus" else 0):  # Ray needs a CPU share per actor
            least = "positive" if key == "num_cpus" else ">= 0"
            raise ValueError(f"--flower-resources {key} must be {least}, got {value.strip()}")
    return resources
