"""Non-IID splits of a labelled dataset over federated clients, looked up by name.

Chen et al. (ICLR 2023, §4.2 and Appendix B.1) split each training set over 10 clients with a
Dirichlet(alpha = 0.3) label skew (Hsu et al. 2019); NIID-Bench (Li et al., ICDE 2022, "simulating non-IID
data") adds the #C = k label-shard, Dirichlet quantity-skew and per-client feature-noise splits. ``natural``
keeps a dataset's own client ids (e.g. FEMNIST writers).

Every entry of :data:`PARTITIONS` is a pure function ``(labels (N,), cfg, rng) -> [indices]`` returning one
sorted int64 index array per client, each sample in exactly one array. :func:`partition` validates, seeds,
and redraws (boundedly) until every client holds ``cfg.min_size`` samples.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_SEED_TAG = 0x5041_5254  # "PART": keeps partition draws independent of other streams seeded with cfg.seed


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class PartitionError(ValueError):
    """A partition that cannot be drawn as asked; the message is one line (the CLI prints it, exit 2)."""


@dataclass(frozen=True)
class PartitionConfig:
    name: str = "dirichlet"  # iid | dirichlet | shards | quantity | noise | natural
    clients: int = 10  # Chen et al. §4.2 default setting: 10 clients (ignored by `natural`)
    alpha: float = 0.3  # Dir(alpha) label skew (Chen et al. §4.2 default alpha = 0.3; Hsu et al. 2019)
    labels_per_client: int = 2  # shards: #C = k labels per client (NIID-Bench, label skew)
    beta: float = 0.5  # quantity skew: client sizes ~ Dir(beta) (NIID-Bench, quantity skew)
    noise: float = 0.1  # noise: client i gets Gaussian sigma * i / clients, [0,1] pixel units (NIID-Bench)
    min_size: int = 10  # samples every client must have (NIID-Bench's min_require_size = 10)
    max_redraws: int = 1000  # draws tried before giving up with PartitionError
    seed: int = 0  # the split is drawn from SeedSequence([seed, _SEED_TAG]): same seed, same split

    def __post_init__(self) -> None:
        if self.name not in PARTITIONS:
            raise PartitionError(f"unknown partition {self.name!r}; choose from {', '.join(PARTITIONS)}")
        for key in ("alpha", "beta"):
            value = getattr(self, key)
            if not (_real(value) and np.isfinite(value) and value > 0):
                raise PartitionError(f"partition {key} must be a finite number > 0, got {value!r}")
        for key, low in (("clients", 1), ("labels_per_client", 1), ("min_size", 0), ("max_redraws", 1),
                         ("seed", 0)):
            value = getattr(self, key)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < low:
                raise PartitionError(f"partition {key} must be an integer >= {low}, got {value!r}")
        if not (_real(self.noise) and np.isfinite(self.noise) and self.noise >= 0):
            raise PartitionError(f"partition noise must be a finite number >= 0, got {self.noise!r}")


# --------------------------------------------------------------------------- the partitions (pure)

def _parts(owner: np.ndarray, clients: int) -> list[np.ndarray]:
    """``owner`` (N,) client of each sample -> one ascending int64 index array per client."""
    order = np.argsort(owner, kind="stable").astype(np.int64)  # stable: indices stay ascending per client
    return np.split(order, np.cumsum(np.bincount(owner, minlength=clients))[:-1])


def _by_class(labels: np.ndarray) -> list[np.ndarray]:
    """Indices of each present class, in ascending class order."""
    order = np.argsort(labels, kind="stable")
    _, counts = np.unique(labels, return_counts=True)
    return np.split(order, np.cumsum(counts)[:-1])


def _even(n: int, parts: int) -> np.ndarray:
    """Sizes of ``n`` items dealt into ``parts`` near-equal parts (the first ``n % parts`` get one more)."""
    return n // parts + (np.arange(parts) < n % parts)


def _proportional(p: np.ndarray, n: int) -> np.ndarray:
    """Sizes of ``n`` items cut at the cumulative proportions ``p``, cut points rounded to nearest.

    NIID-Bench truncates instead, which hands the last client the rounding remainder of every class (at least
    one sample when the float cumsum stops just below 1): +20% for the last of 50 clients over 1000 classes.
    """
    edges = np.rint(np.cumsum(p) * n).astype(np.int64)
    edges[-1] = n
    return np.diff(edges, prepend=0)


def iid(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into ``cfg.clients`` parts whose sizes differ by at most one."""
    owner = np.empty(len(labels), np.int64)
    owner[rng.permutation(len(labels))] = np.repeat(np.arange(cfg.clients), _even(len(labels), cfg.clients))
    return _parts(owner, cfg.clients)


def dirichlet(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew: each class's shuffled indices are cut at Dir(alpha) proportions over clients.

    Hsu et al. (2019) / NIID-Bench label skew "p_k ~ Dir_N(beta)", as in NIID-Bench's reference code,
    *including* its balance trick: a client already holding >= N / clients samples gets proportion 0 for
    later classes (classes are visited in ascending label order). If that zeroes every drawn proportion,
    the unmasked draw is used.
    """
    n, k = len(labels), cfg.clients
    owner = np.empty(n, np.int64)
    sizes = np.zeros(k, np.int64)
    for idx in _by_class(labels):
        drawn = rng.dirichlet(np.full(k, cfg.alpha))
        p = drawn * (sizes < n / k)
        p = p / p.sum() if p.sum() > 0 else drawn / drawn.sum()
        counts = _proportional(p, len(idx))
        owner[rng.permutation(idx)] = np.repeat(np.arange(k), counts)
        sizes += counts
    return _parts(owner, k)


def shards(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """#C = k: each client holds k distinct labels; a label's samples are split evenly among its holders.

    NIID-Bench label skew (#C = k). Labels are dealt least-used-first with random tie-breaking, so every
    present label is held by someone (``clients * k >= classes`` is required) and label use differs by at
    most one between labels; NIID-Bench's code instead gives client i label ``i mod C`` plus k - 1 random
    others, which drops labels when clients < classes.
    """
    groups = _by_class(labels)
    c, k = len(groups), cfg.labels_per_client
    if k > c:
        raise PartitionError(f"labels_per_client={k} but the data has only {c} classes")
    if cfg.clients * k < c:
        raise PartitionError(f"{cfg.clients} clients x {k} labels cannot cover {c} classes; "
                             f"use more clients or a larger labels_per_client")
    held = np.zeros((cfg.clients, c), bool)  # (clients, classes)
    for client in range(cfg.clients):
        pick = np.lexsort((rng.random(c), held.sum(0)))[:k]  # fewest holders first, ties at random
        held[client, pick] = True
    owner = np.empty(len(labels), np.int64)
    for label, idx in enumerate(groups):
        holders = np.flatnonzero(held[:, label])
        owner[rng.permutation(idx)] = np.repeat(holders, _even(len(idx), len(holders)))
    return _parts(owner, cfg.clients)


def quantity(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Quantity skew: a random permutation cut at Dir(beta) proportions (NIID-Bench, quantity skew)."""
    sizes = _proportional(rng.dirichlet(np.full(cfg.clients, cfg.beta)), len(labels))
    owner = np.empty(len(labels), np.int64)
    owner[rng.permutation(len(labels))] = np.repeat(np.arange(cfg.clients), sizes)
    return _parts(owner, cfg.clients)


def noise(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Feature skew (NIID-Bench, noise-based): the IID split; :func:`client_noise` gives each sigma."""
    return iid(labels, cfg, rng)


def natural(ids: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """One part per distinct client id, in sorted id order; ``cfg.clients`` and ``rng`` are ignored.

    Receives the per-sample client ids (not the labels) from :func:`partition`.
    """
    unique, owner = np.unique(ids, return_inverse=True)
    return _parts(owner.reshape(-1), len(unique))


PARTITIONS: dict[str, Callable[[np.ndarray, PartitionConfig, np.random.Generator], list[np.ndarray]]] = {
    "iid": iid, "dirichlet": dirichlet, "shards": shards, "quantity": quantity, "noise": noise,
    "natural": natural,
}
_BY_ID = frozenset({"natural"})  # partitions that split the per-sample client ids rather than the labels
_HINTS = {"dirichlet": "use a larger alpha, fewer clients or a smaller min_size",
          "quantity": "use a larger beta, fewer clients or a smaller min_size",
          "shards": "use a larger labels_per_client, fewer clients or a smaller min_size"}


DRAWN_MIN_SIZE = 10  # NIID-Bench's minimum client size for drawn partitions


def default_min_size(name: str) -> int:
    """The minimum client size to ask for by default: NIID-Bench's 10 for drawn partitions; 1 for given
    (natural) clients, which are data, not a draw (e.g. a city with few images is still a city)."""
    return 1 if name in _BY_ID else DRAWN_MIN_SIZE


# --------------------------------------------------------------------------- driver

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
    if cfg.name in _BY_ID:
        if natural is None:
            raise PartitionError(f"the {cfg.name} partition needs the dataset's per-sample client ids")
        ids = np.asarray(natural)
        if ids.shape != labels.shape:
            raise PartitionError(f"client ids have shape {ids.shape} but labels have shape {labels.shape}")
        parts = PARTITIONS[cfg.name](ids, cfg, np.random.default_rng(0))
        small = [i for i, p in enumerate(parts) if len(p) < cfg.min_size]
        if small:
            raise PartitionError(f"{len(small)} natural clients have fewer than min_size={cfg.min_size} "
                                 f"samples (smallest: {min(len(parts[i]) for i in small)}); lower min_size")
        return parts
    _check_feasible(labels, cfg)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, _SEED_TAG]))
    smallest = 0
    for _ in range(cfg.max_redraws):
        parts = PARTITIONS[cfg.name](labels, cfg, rng)
        if min(len(p) for p in parts) >= cfg.min_size:
            return parts
        smallest = max(smallest, min(len(p) for p in parts))
    hint = _HINTS.get(cfg.name, "use fewer clients or a smaller min_size")
    raise PartitionError(f"{cfg.name} partition: no draw in {cfg.max_redraws} gave all {cfg.clients} clients "
                         f"min_size={cfg.min_size} of {n} samples (best smallest client: {smallest}); {hint}")


def _check_feasible(labels: np.ndarray, cfg: PartitionConfig) -> None:
    """Errors no redraw could fix (a partition raises its own, e.g. ``shards``, on the first draw)."""
    n = len(labels)
    if cfg.clients > n:
        raise PartitionError(f"{cfg.clients} clients but only {n} samples; use at most {n} clients")
    if cfg.clients * cfg.min_size > n:
        raise PartitionError(f"{n} samples cannot give {cfg.clients} clients min_size={cfg.min_size} each; "
                             f"use fewer clients or a smaller min_size")


def client_noise(cfg: PartitionConfig, client: int) -> float:
    """Gaussian noise sigma for ``client`` (0-based): ``noise * client / clients`` for ``noise``, else 0.

    NIID-Bench writes Gau(sigma * i / N) for party i; here i is 0-based, so client 0 is clean and the last
    gets sigma * (N - 1) / N (NIID-Bench's released code divides by N - 1, giving the last client sigma).
    """
    if cfg.name != "noise":
        return 0.0
    if not 0 <= client < cfg.clients:
        raise PartitionError(f"client {client} out of range for {cfg.clients} clients")
    return cfg.noise * client / cfg.clients


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


__all__ = ["PARTITIONS", "PartitionConfig", "PartitionError", "client_noise", "partition", "summary"]
