"""Registries of plugins looked up by name: algorithms, methods, backbones, datasets, partitions, tasks.

As timm's ``@register_model``: a plugin is one file whose class or function carries ``@REGISTRY.register``,
and a registry built with ``discover="package"`` imports every module of that package on first use, so
adding a plugin touches that one file (and its test). Tests loop over the registries.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """A read-only mapping name -> plugin, filled by :meth:`register`."""

    def __init__(self, what: str, discover: str | None = None):
        self.what = what  # "algorithm", "dataset", ...: used in error messages
        self._entries: dict[str, T] = {}
        self._package = discover  # import every module of this package on first lookup
        self._discovered = discover is None

    def register(self, obj: T | None = None, *, name: str | None = None) -> T | Callable[[T], T]:
        """``@REG.register`` (the name is ``obj.name``), ``@REG.register(name="x")`` or ``REG.register(x,
        name="x")``. A name registered twice by different objects is an error."""
        def add(item: T) -> T:
            key = name or getattr(item, "name", None)
            if not isinstance(key, str) or not key:
                raise TypeError(f"a {self.what} needs a name to be registered")
            if key in self._entries and self._entries[key] is not item:
                raise ValueError(f"{self.what} {key!r} is registered twice")
            self._entries[key] = item
            return item
        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Remove an entry (tests that register a toy plugin clean up with this)."""
        self._entries.pop(name, None)

    def lookup(self, name: str, error: type[Exception] = ValueError) -> T:
        """The entry called ``name``, or one ``error`` line listing the known names."""
        self._discover()
        if name not in self._entries:
            raise error(f"unknown {self.what} {name!r}; choose from {', '.join(self)}")
        return self._entries[name]

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self._package)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{self._package}.{module.name}")

    def __getitem__(self, name: str) -> T:
        self._discover()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        """Names in sorted order: the same whatever imported a plugin module first."""
        self._discover()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self._discover()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what}: {', '.join(self)})"
