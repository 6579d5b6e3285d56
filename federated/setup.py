"""Everything a federated run needs before its first round (Chen et al., ICLR 2023, §4.2): the data (loaded
unless given), the partition over clients and its report, the task, the initialised model and the algorithm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pretrain.backbones import create_backbone

from .algorithms import ALGORITHMS, FedAvg
from .datasets import DataConfig, ImageData, load_dataset
from .experiment import FederateConfig
from .initialisation import InitSource, initialise
from .partitions import partition, write_partition_report
from .shards import Shard
from .tasks import TASKS, Task


@dataclass
class Setup:
    data: ImageData
    parts: list[torch.Tensor]
    task: Task
    model: nn.Module
    algo: FedAvg
    init_report: str
    amp: bool = False  # --amp: bf16 autocast of local training and evaluation (federated.rounds.precision)
    compile: bool = False  # --compile: the one-client step compiled (federated.rounds.local_model)
    capture: Callable | None = None  # --cuda-graph: how vectorised lock-steps are captured (batched.LockStep)
    graphs: dict = field(default_factory=dict)  # --cuda-graph: the captured lock-steps, kept across rounds


def setup(cfg: FederateConfig, device: torch.device, data: ImageData | None = None,
          load_init: bool = True, shard: Shard | None = None, init: InitSource | None = None) -> Setup:
    """Data (loaded unless given), partition, task, model (initialised from ``cfg.init`` if
    ``load_init``) and algorithm, on ``device``. With ``shard`` (a Flower node's own data,
    :mod:`federated.shards`) the data is the shard, its client's partition the whole of it, and the other
    clients' sizes and class counts come from the shard's manifest."""
    if shard is None:
        data, task, parts = partitioned(cfg, data)
        counts = client_class_counts(task, data, parts)
        sizes = [len(p) for p in parts]
    else:
        data, task = shard.data, TASKS[shard.data.task](shard.data, cfg)
        sizes, counts = list(shard.manifest["sizes"]), np.asarray(shard.manifest["class_counts"])
        parts = [torch.zeros(0, dtype=torch.long) for _ in sizes]
        parts[shard.client] = torch.arange(len(data.train_y))
    # the CL baseline trains plain SGD on the pooled data: client and server steps have no meaning there
    algo_cls = FedAvg if cfg.centralized else ALGORITHMS[cfg.algo]
    missing = algo_cls.requires - task.provides
    if missing:
        raise ValueError(f"--algo {cfg.algo} needs {', '.join(sorted(missing))}, which the {data.task} task "
                         f"does not provide; choose another algorithm")
    torch.manual_seed(cfg.seed)
    backbone = create_backbone(cfg.arch, cfg.width)
    # the runner passes the --init it resolved and checked (federated.runner.run); others give the spec
    report = (initialise(backbone, cfg.arch, cfg.width, init or cfg.init, cfg.init_format) if load_init
              else f"resumed from the run's state ({cfg.init} at the start)")
    model = task.build_model(backbone)
    algo_cfg = FedAvg.Config() if cfg.centralized else cfg.algo_config()
    algo = algo_cls(algo_cfg, sizes, counts)
    algo.attach(model)
    # channels-last weights (the inputs already are, see tasks/transforms.py): ResNet20 rounds on digits ran
    # about 20% faster with them on the 2-core CPU VM, and it is the layout GPU tensor cores want
    model = model.to(device, memory_format=torch.channels_last)
    return Setup(data.to(device), [torch.as_tensor(p, dtype=torch.long) for p in parts], task, model, algo,
                 report, cfg.amp)


def partitioned(cfg: FederateConfig,
                data: ImageData | None = None) -> tuple[ImageData, Task, list[np.ndarray]]:
    """The run's data (loaded unless given), its task, and every client's training-sample positions."""
    if data is None:
        data = load_dataset(data_config(cfg))
    task = TASKS[data.task](data, cfg)
    labels = task.sample_labels(data.train_y).numpy()
    natural = data.clients.numpy() if data.clients is not None else None
    return data, task, partition(labels, cfg.partition_config(), natural)


def data_config(cfg: FederateConfig) -> DataConfig:
    """The loader's settings of a run: its data group, field by field (two named differently there)."""
    return DataConfig(**{f.name: getattr(cfg, _AS_NAMED.get(f.name, f.name)) for f in fields(DataConfig)})


# DataConfig field -> FederateConfig field
_AS_NAMED = {"name": "dataset", "root": "data_root", "options": "data_args"}


def client_class_counts(task: Task, data: ImageData, parts: list) -> np.ndarray:
    """(clients, classes) sample counts per class of every client (FedIR's and FedVC's server knowledge)."""
    return np.stack([task.class_counts(data.train_y[torch.as_tensor(p)]).numpy() for p in parts])


def write_partition(run_dir: Path, cfg: FederateConfig, s: Setup) -> None:
    """partition.json and partition.png of the run (:mod:`federated.partitions.report`)."""
    parts = [p.numpy() for p in s.parts]
    labels = s.task.sample_labels(s.data.train_y.cpu()).numpy()  # one class per sample (segmentation too)
    write_partition_report(run_dir, parts, labels, s.data.n_classes, cfg.partition_config())
