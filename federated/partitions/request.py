"""A partition request, :class:`PartitionConfig`, and the registry-wide view of the partitions' settings.

Each partition declares its own hyperparameters in its file (its ``Config``); a request carries the
driver's fields (name, clients, min_size, max_redraws, seed) plus every registered partition's settings,
defaults filled, so one flat record describes any split (``partition.json``'s "config", the command line).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fpsfl.base.settings import field_default, union_fields

from .base import DRAWN_MIN_SIZE, PARTITIONS, Partition, PartitionError, PartitionSettings

_DRIVER = ("name", "clients", "min_size", "max_redraws", "seed")  # PartitionConfig's own fields


def setting_fields() -> dict[str, dataclasses.Field]:
    """Every registered partition's ``Config`` fields by name, in registry order.

    Two partitions may share a setting only with the same default (it is one command-line flag).
    """
    owners = {name: cls.Config for name, cls in PARTITIONS.items()}
    return union_fields(owners, "partition", dict.fromkeys(_DRIVER, "PartitionConfig"))


def headline(name: str) -> str | None:
    """The setting that tells two splits of partition ``name`` apart in reports: its Config's first field
    (alpha for dirichlet); None for a partition without settings or one not registered (an old run)."""
    cls = PARTITIONS.get(name)
    fields = dataclasses.fields(cls.Config) if cls is not None else ()
    return fields[0].name if fields else None


def headlines() -> dict[str, str]:
    """:func:`headline` of every registered partition that has one, e.g. ``{"dirichlet": "alpha", ...}``."""
    return {name: param for name in PARTITIONS if (param := headline(name)) is not None}


def default_min_size(name: str) -> int:
    """The minimum client size a run asks for by default: NIID-Bench's 10 for drawn partitions; 1 for given
    (natural) clients, which are data, not a draw. Unknown names raise :class:`PartitionError`."""
    return PARTITIONS.lookup(name, PartitionError).default_min_size


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, so settings pass the range checks and serialise to JSON."""
    return value.item() if isinstance(value, np.generic) else value


def _build(cls: type[Partition], values: dict[str, Any]) -> PartitionSettings:
    try:
        return cls.Config(**{f.name: values[f.name] for f in dataclasses.fields(cls.Config)})
    except ValueError as exc:
        raise PartitionError(f"{cls.name} partition: {exc}") from None


class PartitionConfig:
    """Which partition to draw, for how many clients, how hard to try, from which seed, with what settings.

    ``PartitionConfig(name="dirichlet", clients=10, min_size=10, max_redraws=1000, seed=0, **settings)``:
    ``settings`` are any registered partition's hyperparameters (``alpha=0.3``, ``beta=0.5``, ...), each
    defaulting to its declared default and readable as an attribute (``cfg.alpha``). Every partition's
    Config is built from them, so any out-of-range setting is an error whichever partition is chosen.
    Immutable; equal when :meth:`to_dict` is. Raises :class:`PartitionError` (one line).
    """

    __slots__ = ("name", "clients", "min_size", "max_redraws", "seed", "_settings", "_own")

    def __init__(self, name: str = "dirichlet",
                 clients: int = 10,  # Chen et al. §4.2 default setting (ignored by natural clients)
                 *,
                 min_size: int = DRAWN_MIN_SIZE,  # samples every client must have (NIID-Bench: 10)
                 max_redraws: int = 1000,  # draws tried before giving up with PartitionError
                 seed: int = 0,  # the split is drawn from SeedSequence([seed, tag]): same seed, same split
                 **settings: Any) -> None:
        chosen = PARTITIONS.lookup(name, PartitionError)
        driver = {"clients": clients, "min_size": min_size, "max_redraws": max_redraws, "seed": seed}
        for key, low in (("clients", 1), ("min_size", 0), ("max_redraws", 1), ("seed", 0)):
            value = driver[key]
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < low:
                raise PartitionError(f"partition {key} must be an integer >= {low}, got {value!r}")
        fields = setting_fields()
        unknown = sorted(set(settings) - set(fields))
        if unknown:
            raise PartitionError(f"no partition has a setting {unknown[0]!r}; the settings are "
                                 f"{', '.join(fields) or 'none'}")
        values = {k: _plain(settings[k]) if k in settings else field_default(f) for k, f in fields.items()}
        built = {cls: _build(cls, values) for cls in PARTITIONS.values()}
        set_ = object.__setattr__  # immutable: only __init__ assigns
        set_(self, "name", name)
        for key, value in driver.items():
            set_(self, key, int(value))
        set_(self, "_settings", values)
        set_(self, "_own", built[chosen])

    def __getattr__(self, key: str) -> Any:  # only reached when no slot matches: the settings
        try:
            return object.__getattribute__(self, "_settings")[key]
        except (KeyError, AttributeError):
            raise AttributeError(f"PartitionConfig has no attribute {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to {key!r}: PartitionConfig is immutable")

    def __delattr__(self, key: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete {key!r}: PartitionConfig is immutable")

    @property
    def settings(self) -> dict[str, Any]:
        """Every registered partition's setting, defaults filled (a copy)."""
        return dict(self._settings)

    def own(self) -> PartitionSettings:
        """The chosen partition's typed Config (e.g. ``DirichletConfig(alpha=0.3)``)."""
        return self._own

    def to_dict(self) -> dict[str, Any]:
        """Flat: name, clients, every setting, min_size, max_redraws, seed (``partition.json``'s config)."""
        return {"name": self.name, "clients": self.clients, **self._settings, "min_size": self.min_size,
                "max_redraws": self.max_redraws, "seed": self.seed}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().items()))

    def __repr__(self) -> str:
        return f"PartitionConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def __reduce__(self) -> tuple:  # copy and pickle rebuild (and re-validate) rather than set slots
        return _rebuild, (self.to_dict(),)


def _rebuild(record: dict[str, Any]) -> PartitionConfig:
    return PartitionConfig(**record)
