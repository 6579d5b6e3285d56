"""Typed configuration of a federated run, with the defaults of Chen et al., ICLR 2023 (§4.2, Table 9).

The default setting is the paper's: 10 clients, Dir(alpha = 0.3), full participation, 5 local epochs,
100 rounds, SGD with momentum 0.9 and weight decay 1e-4, learning rate x0.1 every 30 rounds. Learning rate,
batch size and optimiser come from the dataset's preset (Table 9, declared in the dataset's file), and so do
its default partition and architecture.

The settings come in groups (:mod:`federated.groups`: data, partitioning, training, model, run), frozen
dataclasses that :class:`FederateConfig` holds; every setting is also read by its flat name (``cfg.lr`` is
``cfg.training.lr``), the name of its flag and its key in every file. Every field carries its help, unit,
source and range (:func:`fpsfl.base.settings.setting`): ``federate``'s flags are generated from them
(:func:`fpsfl.base.settings.flat_fields`). The partitions' own settings (``--alpha``,
``--labels-per-client``, ...) are declared in each partition's file, and the datasets' (``--split-csv``,
``--crop-size``) in each dataset's; :class:`FederateConfig` takes any registered partition's or dataset's
settings as keyword arguments, keeps them in ``partition_args`` and ``data_args`` and writes them flat in
``config.json``, as before.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fpsfl.base.rundir import RunFlags
from fpsfl.base.settings import check, group, override, setting, typed_overrides, typed_table

from .algorithms import ALGORITHMS, AlgoConfig
from .datasets import DATASETS, DataConfig, DataError, Preset, own_settings
from .datasets import setting_fields as dataset_settings
from .groups import DataGroup, ModelGroup, PartitionGroup, RunGroup, TrainingGroup
from .oracle.tracking import TrackConfig
from .partitions import PARTITIONS, PartitionConfig, PartitionError, default_min_size, setting_fields


@dataclass(frozen=True, init=False)
class FederateConfig:
    data: DataGroup = group(DataGroup, "the dataset and how it is loaded")
    partitioning: PartitionGroup = group(PartitionGroup, "the clients and how the data is split")
    training: TrainingGroup = group(TrainingGroup, "the FL algorithm and local training")
    model: ModelGroup = group(ModelGroup, "the backbone and its initial weights")
    run: RunGroup = group(RunGroup, "seed, evaluation and what the run keeps")

    def __init__(self, **values: Any) -> None:
        """Keyword arguments: the groups (``training=TrainingGroup(...)``) and any setting by its flat
        name (``rounds=5``), which wins over its group's; any registered partition's settings (``alpha=0.1``)
        land in ``partition_args`` and any dataset's (``split_csv=...``) in ``data_args``. None for
        ``partition`` and ``arch`` means the dataset's default."""
        owner = _OWNER
        by_group = {g: dict(vars(values.pop(g))) if g in values else {} for g in SETTING_GROUPS}
        for table, known in flat_settings().items():
            given = {**(values.pop(table, None) or by_group[owner[table]].get(table) or {}),
                     **{k: values.pop(k) for k in list(values) if k in known}}
            by_group[owner[table]][table] = {k: given.get(k, f.default) for k, f in known.items()} | given
        unknown = sorted(set(values) - set(owner))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected settings: {', '.join(unknown)}")
        for name, value in values.items():
            by_group[owner[name]][name] = value
        for name, cls in SETTING_GROUPS.items():
            object.__setattr__(self, name, cls(**by_group[name]))
        spec = DATASETS.lookup(self.dataset, DataError)
        if self.partition is None:
            self._set(partition=spec.default_partition)
        if self.arch is None:
            self._set(arch=spec.default_arch)
        self.__post_init__()

    def _set(self, **values: Any) -> None:
        """Settings replaced in their groups, while the config is being built (it is frozen after)."""
        for name, value in values.items():
            held = getattr(self, _OWNER[name])
            object.__setattr__(self, _OWNER[name], dataclasses.replace(held, **{name: value}))

    def __getattr__(self, name: str) -> Any:
        """A partition's or dataset's setting (``cfg.alpha``, ``cfg.crop_size``), including one a plugin
        registered after this was built."""
        if name.startswith("__") or name in _OWNER or name in SETTING_GROUPS:
            raise AttributeError(name)  # not built yet (unpickling): no group to read from
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
        self._set(algo_args=typed_algo_args(self.algo, self.algo_args))
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
        known = set(_OWNER).union(*flat_settings().values())
        values = {k: v for k, v in values.items() if k in known}
        tracking = dict(values.pop("tracking", {}))
        tracking["track"] = tuple(tracking.get("track", ()))
        values["save_local_models"] = tuple(values.get("save_local_models", ()))
        return merge({**values, "tracking": tracking})

    def settings(self, plain: bool = False) -> dict[str, Any]:
        """Every setting by its flat name, as given (None: the preset's), the tables as tables; ``plain``:
        as :func:`dataclasses.asdict` gives them (``tracking`` a dict, every value a copy)."""
        groups = [getattr(self, f.name) for f in fields(self)]
        if plain:
            return {k: v for g in groups for k, v in dataclasses.asdict(g).items()}
        return {f.name: getattr(g, f.name) for g in groups for f in fields(g)}

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config (preset lr, batch and optimiser), partition and dataset settings flat."""
        record = self.settings(plain=True)
        for table in flat_settings():
            record.update(record.pop(table))
        return {**record, "lr": self.resolved_lr(),
                "batch_size": self.resolved_batch(), "optimizer": self.resolved_optimizer()}


# each group field of FederateConfig -> its dataclass (federated.groups); a --config file's [federate.NAME]
SETTING_GROUPS: dict[str, type] = {f.name: f.metadata["nested"] for f in fields(FederateConfig)}
_OWNER = {leaf.name: name for name, cls in SETTING_GROUPS.items() for leaf in fields(cls)}  # setting -> group


for _name, _group in _OWNER.items():  # cfg.lr reads cfg.training.lr: one name everywhere, as its flag
    setattr(FederateConfig, _name, property(operator.attrgetter(f"{_group}.{_name}")))


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
    compile: bool = setting(False, "torch.compile each client's forward and backward when clients train "
                                   "one at a time in process (--client-batch 1; vectorised clients and "
                                   "Flower ClientApps stay eager); for a GPU, where a step is bound by its "
                                   "launches (docs/performance.md); results equal eager ones within float "
                                   "rounding", group="run")
    cuda_graph: bool = setting(False, "vectorised clients (--client-batch K > 1) on CUDA: the steps at which "
                                      "every client still training has a full batch run in lock-step as "
                                      "one captured CUDA graph, replayed (finished clients are masked "
                                      "out); the other steps run eagerly (docs/performance.md: CUDA graphs)",
                               group="run")
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
