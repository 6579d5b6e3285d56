"""Pure helpers the partitions share: owners -> index arrays, per-class indices, and size rounding."""

from __future__ import annotations

import numpy as np


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
