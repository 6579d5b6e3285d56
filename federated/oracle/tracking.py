"""Per-round analyses inside a federated run: optimal convex aggregation and loss variance over lambda.

Chen et al., ICLR 2023, §6.2 (Eq. 4, Figs. 7, 8, 13, 18). Every ``every`` rounds the round's local models
are combined (BatchNorm statistics with the same weights, as FedAvg does; or re-estimated on training data
with ``bn_recompute``) and:

* ``convex``: FedAvg's accuracy, the optimal-convex accuracy and lambda* (an *oracle* on the test set, as
  in the paper; ``data="val"`` searches on the validation split instead);
* ``variance``: the test loss of ``variance_samples`` combinations with lambda ~ Dirichlet(1): mean, 95%
  interval, variance and the losses themselves (for histograms).

``aggregation="optimal-convex"`` makes lambda* the aggregation of every round (Fig. 7's dashed curves):
the algorithm's own aggregate is still computed, so its server state stays updated, then replaced.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

import numpy as np
import torch

from federated.oracle.combine import State, combine, loss_summary
from federated.oracle.convex import ConvexConfig, loss_variance, optimal_convex
from federated.oracle.evaluate import Evaluator

TRACKS = ("convex", "variance")
AGGREGATIONS = ("algo", "optimal-convex")


@dataclass(frozen=True)
class TrackConfig:
    track: tuple[str, ...] = ()  # analyses to log: convex, variance
    every: int = 10  # rounds between tracked rounds
    aggregation: str = "algo"  # algo: the algorithm's own; optimal-convex: lambda* every round (Fig. 7)
    data: str = "test"  # test (the paper's oracle) | val: where the convex search looks
    variance_samples: int = 300  # lambda draws per tracked round (§6.2, Fig. 8)
    bn_recompute: bool = False  # re-estimate BatchNorm statistics of combined models on training data
    bn_samples: int = 2000  # training images for that re-estimation
    convex_lr: float = ConvexConfig.lr
    convex_epochs: int = ConvexConfig.epochs
    convex_batch: int = ConvexConfig.batch_size
    convex_starts: int = ConvexConfig.random_starts

    def __post_init__(self) -> None:
        unknown = sorted(set(self.track) - set(TRACKS))
        checks = {
            f"unknown --track {', '.join(unknown)}; choose from {', '.join(TRACKS)}": not unknown,
            f"--aggregation must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}":
                self.aggregation in AGGREGATIONS,
            f"--convex-data must be test or val, got {self.data!r}": self.data in ("test", "val"),
            "--track-every, --variance-samples, --convex-epochs and --convex-batch must be positive":
                min(self.every, self.variance_samples, self.convex_epochs, self.convex_batch) > 0,
            "--convex-lr must be positive": self.convex_lr > 0,
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(message)

    @property
    def active(self) -> bool:
        return bool(self.track) or self.aggregation == "optimal-convex"

    def convex(self, seed: int) -> ConvexConfig:
        return ConvexConfig(lr=self.convex_lr, epochs=self.convex_epochs, batch_size=self.convex_batch,
                            random_starts=self.convex_starts, seed=seed)


class Tracker:
    """Runs the configured analyses on a round's local models; built once per run."""

    def __init__(self, cfg: TrackConfig, model: torch.nn.Module, task, data, seed: int):
        if cfg.data == "val" and len(data.val_y) == 0:
            raise ValueError("--convex-data val needs a validation split; set --val-fraction above 0")
        self.cfg, self.task, self.seed = cfg, task, seed
        self.model = copy.deepcopy(model)
        recompute = None
        if cfg.bn_recompute:
            pick = torch.randperm(len(data.train_y), generator=torch.Generator().manual_seed(seed))
            pick = pick[:cfg.bn_samples].sort().values.to(data.train_y.device)
            recompute = (data.train_x[pick], data.train_y[pick])
        self.search_x, self.search_y = (data.test_x, data.test_y) if cfg.data == "test" else (data.val_x,
                                                                                              data.val_y)
        self.on_search = Evaluator(self.model, task, self.search_x, self.search_y, recompute)
        self.on_test = Evaluator(self.model, task, data.test_x, data.test_y, recompute)

    def due(self, rnd: int) -> bool:
        """Whether round ``rnd`` (1-based) runs the analyses (every round under optimal-convex)."""
        every_round = self.cfg.aggregation == "optimal-convex"
        return every_round or (bool(self.cfg.track) and rnd % self.cfg.every == 0)

    def _batches(self, rnd: int):
        def batches(epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, rnd, epoch, 7])
                                                    .generate_state(1)[0]))
            order = torch.randperm(len(self.search_y), generator=gen).to(self.search_y.device)
            size = self.cfg.convex_batch
            return [self.task.eval_inputs(self.search_x[order[i:i + size]], self.search_y[order[i:i + size]])
                    for i in range(0, len(order), size)]
        return batches

    def __call__(self, rnd: int, states: list[State], sizes: list[int]) -> tuple[dict, State | None]:
        """(metrics to log, the state to aggregate to or None) for round ``rnd`` (1-based)."""
        record: dict = {}
        override = None
        track_convex = "convex" in self.cfg.track and rnd % self.cfg.every == 0
        if track_convex or self.cfg.aggregation == "optimal-convex":
            result = optimal_convex(self.model, states, sizes, self.on_search, self.task.loss,
                                    self._batches(rnd), self.cfg.convex(self.seed + rnd))
            if track_convex:
                record["convex"] = {k: v for k, v in result.items() if k != "candidates"} | {
                    "data": self.cfg.data, "candidates": result["candidates"]}
            if self.cfg.aggregation == "optimal-convex":
                override = combine(states, result["lambda"])
        if "variance" in self.cfg.track and rnd % self.cfg.every == 0:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, rnd, 11]))
            losses = loss_variance(states, self.on_test, self.cfg.variance_samples, rng)
            record["variance"] = {**loss_summary(losses), "losses": losses}
        return record, override


def add_search_arguments(group) -> None:
    """The flags of the convex search and the variance sampling (shared by federate and analyze)."""
    group.add_argument("--convex-data", choices=("test", "val"), default="test",
                       help="data of the convex search: test (the paper's oracle, default) or val")
    group.add_argument("--variance-samples", type=int, default=300,
                       help="lambda ~ Dirichlet(1) draws per tracked round (default 300, the paper's)")
    group.add_argument("--convex-lr", type=float, default=TrackConfig.convex_lr,
                       help="SGD lr of the search on w, lambda = softmax(w) (default 1e-5, the paper's)")
    group.add_argument("--convex-epochs", type=int, default=TrackConfig.convex_epochs,
                       help="search epochs over its data (default 20, the paper's)")
    group.add_argument("--convex-batch", type=int, default=TrackConfig.convex_batch,
                       help="search batch size (default 32, the paper's)")
    group.add_argument("--convex-starts", type=int, default=TrackConfig.convex_starts,
                       help="Dirichlet(1) starts besides uniform and FedAvg's weights (default 2)")
    group.add_argument("--bn-recompute", action="store_true",
                       help="re-estimate combined models' BatchNorm statistics on 2,000 training images "
                       "instead of averaging them (slower)")


def track_config(args: argparse.Namespace, **fields) -> TrackConfig:
    """The TrackConfig of parsed :func:`add_search_arguments` flags plus ``fields``."""
    return TrackConfig(data=args.convex_data, variance_samples=args.variance_samples,
                       bn_recompute=args.bn_recompute, convex_lr=args.convex_lr,
                       convex_epochs=args.convex_epochs, convex_batch=args.convex_batch,
                       convex_starts=args.convex_starts, **fields)
