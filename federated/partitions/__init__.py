"""Non-IID splits of a labelled dataset over federated clients, one plugin file per partition.

Chen et al. (ICLR 2023, §4.2 and Appendix B.1) split each training set over 10 clients with a
Dirichlet(alpha = 0.3) label skew (Hsu et al. 2019); NIID-Bench (Li et al., ICDE 2022, "simulating non-IID
data") adds the #C = k label-shard, Dirichlet quantity-skew and per-client feature-noise splits. ``natural``
keeps a dataset's own client ids (e.g. FEMNIST writers).

Every entry of :data:`PARTITIONS` is a :class:`Partition` subclass in its own module, carrying its own
hyperparameters (``Config``); its pure ``split(labels (N,), clients, rng)`` returns one sorted int64 index
array per client, each sample in exactly one array. :func:`partition` validates, seeds, and redraws
(boundedly) until every client holds ``cfg.min_size`` samples; :func:`write_partition_report` records it.
"""

from __future__ import annotations

from .base import DRAWN_MIN_SIZE, PARTITIONS, Partition, PartitionError, PartitionSettings
from .driver import client_noise, partition, summary
from .report import indices_sha256, partition_figure, write_partition_report
from .request import PartitionConfig, default_min_size, headline, headlines, setting_fields

__all__ = ["DRAWN_MIN_SIZE", "PARTITIONS", "Partition", "PartitionConfig", "PartitionError",
           "PartitionSettings", "client_noise", "default_min_size", "headline", "headlines", "indices_sha256",
           "partition", "partition_figure", "setting_fields", "summary", "write_partition_report"]
