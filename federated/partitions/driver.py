"""The partition driver: validate, seed, draw and (boundedly) redraw until every client is big enough.

Every partition (:data:`PARTITIONS`) only draws; :func:`partition` checks the request, seeds the stream from
``cfg.seed`` and redraws from it until every client holds ``cfg.min_size`` samples.
"""

from __future__ import annotations

import numpy as np

from .base import PARTITIONS, Partition, PartitionError
from .request import PartitionConfig

_SEED_TAG = 0x5041_5254  # "PART": keeps partition draws independent of other streams seeded with cfg.seed


def _plugin(cfg: PartitionConfig) -> Partition:
    return PARTITIONS[cfg.name](cfg.own())


def partition(labels: np.ndarray, cfg: PartitionConfig,
              natural: np.ndarray | None = None) -> list[np.ndarray]:
    """Split ``labels`` (N,) int into one sorted int64 index array per client, reproducibly from ``cfg.seed``.

    Draws are redrawn (from the same seeded stream) until every client has ``cfg.min_size`` samples, at
    most ``cfg.max_redraws`` times; ``natural`` ids are never redrawn. Raises :class:`PartitionError`.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(f"labels must be a non-empty 1-D integer array, got {labels.dtype} "
                             f"{labels.shape}")
    n = len(labels)
    plugin = _plugin(cfg)
    if plugin.by_id:
        return _given(plugin, labels, cfg, natural)
    _check_feasible(labels, cfg)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, _SEED_TAG]))
    smallest = 0
    for _ in range(cfg.max_redraws):
        parts = plugin.split(labels, cfg.clients, rng)
        if min(len(p) for p in parts) >= cfg.min_size:
            return parts
        smallest = max(smallest, min(len(p) for p in parts))
    raise PartitionError(f"{cfg.name} partition: no draw in {cfg.max_redraws} gave all {cfg.clients} clients "
                         f"min_size={cfg.min_size} of {n} samples (best smallest client: {smallest}); "
                         f"{plugin.hint}")


def _given(plugin: Partition, labels: np.ndarray, cfg: PartitionConfig,
           natural: np.ndarray | None) -> list[np.ndarray]:
    """A split of the per-sample client ids ``natural``: drawn once (they are data), min_size enforced."""
    if natural is None:
        raise PartitionError(f"the {cfg.name} partition needs the dataset's per-sample client ids")
    ids = np.asarray(natural)
    if ids.shape != labels.shape:
        raise PartitionError(f"client ids have shape {ids.shape} but labels have shape {labels.shape}")
    parts = plugin.split(ids, cfg.clients, np.random.default_rng(0))
    small = [i for i, p in enumerate(parts) if len(p) < cfg.min_size]
    if small:
        raise PartitionError(f"{len(small)} {cfg.name} clients have fewer than min_size={cfg.min_size} "
                             f"samples (smallest: {min(len(parts[i]) for i in small)}); lower min_size")
    return parts


def _check_feasible(labels: np.ndarray, cfg: PartitionConfig) -> None:
    """Errors no redraw could fix (a partition raises its own, e.g. ``shards``, on the first draw)."""
    n = len(labels)
    if cfg.clients > n:
        raise PartitionError(f"{cfg.clients} clients but only {n} samples; use at most {n} clients")
    if cfg.clients * cfg.min_size > n:
        raise PartitionError(f"{n} samples cannot give {cfg.clients} clients min_size={cfg.min_size} each; "
                             f"use fewer clients or a smaller min_size")


def client_noise(cfg: PartitionConfig, client: int) -> float:
    """Gaussian noise sigma, [0, 1] pixel units, for ``client`` (0-based): the partition's own
    :meth:`~federated.partitions.Partition.noise` (``noise * client / clients`` for ``noise``, else 0)."""
    return _plugin(cfg).noise(client, cfg.clients)


def summary(parts: list[np.ndarray], labels: np.ndarray, n_classes: int) -> dict:
    """Sizes and per-client class counts of a partition, as plain JSON types."""
    labels = np.asarray(labels)
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        raise PartitionError(f"labels must lie in [0, {n_classes}), got [{labels.min()}, {labels.max()}]")
    counts = np.stack([np.bincount(labels[p], minlength=n_classes) for p in parts]) if parts else \
        np.zeros((0, n_classes), np.int64)
    sizes = counts.sum(1)
    share = counts.max(1, initial=0) / np.maximum(sizes, 1)  # fraction of the client's largest class
    some = len(parts) > 0
    return {"clients": len(parts), "n_classes": int(n_classes), "n_samples": int(sizes.sum()),
            "sizes": sizes.tolist(), "class_counts": counts.tolist(),
            "min_size": int(sizes.min()) if some else 0, "max_size": int(sizes.max()) if some else 0,
            "mean_size": float(sizes.mean()) if some else 0.0,
            "classes_per_client": (counts > 0).sum(1).tolist(),
            "mean_top_class_share": float(share.mean()) if some else 0.0}
