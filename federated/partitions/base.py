"""The interface of a partition plugin: one :class:`Partition` subclass in one file, registered by name.

A partition declares its own hyperparameters as a frozen :class:`PartitionSettings` dataclass (its
``Config``) whose fields are :func:`fpsfl.base.settings.setting` s carrying help (unit, source), range and
command-line group, and splits with the pure :meth:`Partition.split`. :data:`PARTITIONS` imports every
module of this package on first use, so a new partition, hyperparameters included, is one new file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fpsfl.base.registry import Registry
from fpsfl.base.settings import check, field_types

DRAWN_MIN_SIZE = 10  # NIID-Bench's minimum client size (min_require_size = 10) for drawn partitions


class PartitionError(ValueError):
    """A partition that cannot be drawn as asked; the message is one line (the CLI prints it, exit 2)."""


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class PartitionSettings:
    """Base of a partition's own hyperparameters, validated on construction from the fields' metadata.

    An ``int`` field takes Python integers only, a ``float`` field any int or float (bools are neither;
    numpy scalars are refused because :func:`~fpsfl.base.settings.in_interval` would be), then every
    ``within`` range is checked. Raises ValueError, one line, naming the setting.
    """

    def __post_init__(self) -> None:
        kinds = field_types(type(self))
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), kinds[f.name]
            if kind is int and not _integer(value):
                raise ValueError(f"setting {f.name} must be an integer, got {value!r}")
            if kind is float and not _number(value):
                raise ValueError(f"setting {f.name} must be a number, got {value!r}")
        check(self, style="key")


class Partition:
    """A way to split a labelled dataset over clients: subclasses set ``name`` and override :meth:`split`.

    The driver (:func:`federated.partitions.partition`) validates, seeds and redraws; a partition only draws.
    """

    name: ClassVar[str]
    Config: ClassVar[type[PartitionSettings]] = PartitionSettings  # this partition's own hyperparameters
    by_id: ClassVar[bool] = False  # True: split the per-sample client ids (given clients), not the labels
    hint: ClassVar[str] = "use fewer clients or a smaller min_size"  # ends the "no draw fits" error
    default_min_size: ClassVar[int] = DRAWN_MIN_SIZE  # the min_size a run asks for unless told otherwise

    def __init__(self, cfg: PartitionSettings) -> None:
        self.cfg = cfg  # an instance of this class's Config

    def split(self, labels: np.ndarray, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """``labels`` (N,) -> ``clients`` ascending int64 index arrays, each sample in exactly one.

        Pure: draws only from ``rng``. Raises :class:`PartitionError` for requests no redraw can fix.
        """
        raise NotImplementedError

    def noise(self, client: int, clients: int) -> float:
        """Gaussian noise sigma, [0, 1] pixel units, added to ``client``'s (0-based) images: none here."""
        return 0.0


PARTITIONS: Registry[type[Partition]] = Registry("partition", discover="federated.partitions")
