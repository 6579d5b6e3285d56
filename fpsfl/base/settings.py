"""Typed settings: dataclass fields that carry their help, unit, source and valid range.

The dataclasses of :mod:`pretrain.recipe`, :mod:`federated.experiment` and the plugins' configs are the
single source of truth. A field made with :func:`setting` knows its help text (with its unit and paper
section), its range (``within="(0, 1]"``) or choices, and its command-line flag; :func:`check` validates an
instance from that metadata, :mod:`fpsfl.base.cli` turns the fields into argparse flags, and
:func:`override` is the one ``--set KEY=VALUE`` helper (typed, unknown keys refused).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*$")


def setting(default: Any = dataclasses.MISSING, help: str | Callable[[], str] = "", *,
            within: str | None = None, choices: tuple | Callable[[], tuple] | None = None,
            flag: str | None = None, group: str | None = None, parse: Callable[[str], Any] | None = None,
            metavar: str | None = None, default_text: str | None = None, cli: bool = True,
            const: Any = None, default_factory: Any = dataclasses.MISSING, internal: bool = False) -> Any:
    """A dataclass field with its metadata.

    ``within``: an interval such as ``"(0, 1]"`` or ``"[0, inf)"``; ``choices``: the allowed values (or a
    callable giving them); ``flag``: the command-line flag (default ``--field-name``); ``group``: the help
    section; ``parse``: str -> value for flags with a custom syntax; ``default_text``: how the help states
    the default (e.g. for None meaning "the dataset's preset"); ``cli=False`` keeps it off the command line;
    ``const``: the value of the bare flag, whose value becomes optional (``--resume`` = ``--resume yes``);
    ``internal``: a hook for tests, settable from Python only, never from a user's config file (issue 42).
    """
    metadata = {"help": help, "within": within, "choices": choices, "flag": flag, "group": group,
                "parse": parse, "metavar": metavar, "default_text": default_text, "cli": cli,
                "const": const, "internal": internal}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def group(cls: type, help: str) -> Any:
    """A field holding a settings group: the frozen dataclass ``cls``, built from its defaults. Its fields
    are the owner's settings, one flag each, as if declared on the owner (:func:`flat_fields`)."""
    return dataclasses.field(default_factory=cls, metadata={"help": help, "nested": cls, "cli": False})


def _flat(cls: Any) -> Iterator[tuple[type, dataclasses.Field]]:
    """(the dataclass declaring it, the field) for every setting of ``cls`` (a dataclass or an instance),
    each settings group's (:func:`group`) in its place, in declaration order."""
    owner = cls if isinstance(cls, type) else type(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            yield from _flat(f.metadata["nested"])
        else:
            yield owner, f


def flat_fields(cls: Any) -> tuple[dataclasses.Field, ...]:
    """The settings of the dataclass ``cls`` (or an instance): its fields, each settings group's
    (:func:`group`) replaced by the group's own fields, in declaration order."""
    return tuple(f for _, f in _flat(cls))


def flat_types(cls: type) -> dict[str, Any]:
    """:func:`field_types` of every setting of :func:`flat_fields`, groups' settings included."""
    flat = list(_flat(cls))
    kinds = {owner: field_types(owner) for owner in {owner for owner, _ in flat}}
    return {f.name: kinds[owner][f.name] for owner, f in flat}


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def in_interval(value: float, interval: str) -> bool:
    """Whether ``value`` lies in ``interval`` ("(0, 1]", "[0, inf)", ...); NaN never does."""
    found = _INTERVAL.match(interval)
    if not found:
        raise ValueError(f"bad interval {interval!r}")
    left, lo, hi, right = found.groups()
    lo_v, hi_v = float(lo), float(hi)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return False
    above = value >= lo_v if left == "[" else value > lo_v
    below = value <= hi_v if right == "]" else value < hi_v
    return above and below


INT64 = (-(2**63), 2**63 - 1)  # what torch and numpy hold: a larger integer overflows deep inside them
FLOAT32_MAX = 3.4028234663852886e38  # a setting becomes a float32 tensor (lr, weight decay, width...)


def fits(value: Any) -> bool:
    """False for an integer outside int64 or a finite float beyond float32's range (a larger value
    overflows inside torch or numpy, as ``--lr 1e308`` did); anything else is not this check's business."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return INT64[0] <= value <= INT64[1]
    if isinstance(value, float):
        return not math.isfinite(value) or abs(value) <= FLOAT32_MAX
    return True


def choices_of(f: dataclasses.Field) -> tuple | None:
    choices = f.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def check(obj: Any, style: str = "flag") -> None:
    """Validate every field of ``obj`` that declares ``within`` or ``choices``; ValueError (one line) naming
    the flag (``style="flag"``, for command-line configs) or the setting (``"key"``, for --set configs)."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("nested"):
            check(getattr(obj, f.name), style)
        else:
            check_field(f, getattr(obj, f.name), flag_of(f) if style == "flag" else f"setting {f.name}")


def check_field(f: dataclasses.Field, value: Any, name: str) -> None:
    """:func:`check` of one field's ``value`` (None passes: it means the default)."""
    if value is None:
        return
    within, choices = f.metadata.get("within"), choices_of(f)
    items = value if isinstance(value, tuple) else (value,)
    too_large = [v for v in items if not fits(v)]
    if too_large:
        raise ValueError(f"{name} is too large for int64 or float32, got {too_large[0]}")
    if within and not all(in_interval(v, within) for v in items):
        raise ValueError(f"{name} must lie in {within}, got {value!r}")
    if choices is not None and not all(v in choices for v in items):
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of every field (``from __future__ import annotations`` makes them strings)."""
    return typing.get_type_hints(cls)


def scalar(kind: Any) -> Any:
    """``int`` for ``int | None``, the element type for ``tuple[float, ...]``, else ``kind`` itself."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next(a for a in args if a is not type(None))
    if typing.get_origin(kind) is tuple and args:
        return args[0]
    return kind


def coerce(key: str, value: Any, kind: Any) -> Any:
    """``value`` (a string from --set, or a JSON value) as ``kind``; ValueError naming ``key`` otherwise."""
    optional = type(None) in typing.get_args(kind)
    base = scalar(kind)
    text = str(value).strip().lower()
    if optional and (value is None or text == "none"):
        return None
    if typing.get_origin(kind) is dict or kind is dict:  # a table (partition_args): its owner types its keys
        if isinstance(value, dict):
            return value
        raise ValueError(f"setting {key!r} must be a table of settings, got {value!r}")
    if typing.get_origin(kind) is tuple:
        parts = value if isinstance(value, list | tuple) else [p for p in str(value).split(",") if p.strip()]
        return tuple(coerce(key, p, base) for p in parts)
    if isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    try:
        if base is bool:
            if text not in ("true", "false", "1", "0"):
                raise ValueError
            return text in ("true", "1")
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        if base is str and isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value).strip()  # a number where a name is expected reads as that name (TOML: seed = 3)
    except ValueError:
        pass
    raise ValueError(f"setting {key!r} must be a {getattr(base, '__name__', base)}, got {value!r}")


def override(cls: type, values: Mapping[str, Any], owner: str) -> Any:
    """``cls`` built from its defaults and ``values`` (typed with :func:`coerce`): the one --set helper.
    Unknown keys, wrong types and values out of range are one ValueError line starting with ``owner``."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        has = f"; it has {', '.join(sorted(known))}" if known else "; it has none"
        raise ValueError(f"{owner} has no setting {unknown[0]!r}{has}")
    kinds = field_types(cls)
    try:
        return cls(**{k: coerce(k, v, kinds[k]) for k, v in values.items()})
    except ValueError as exc:
        raise ValueError(f"{owner}: {exc}") from None


def typed_overrides(cls: type, values: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``values`` (settings as --set, a config file or a recipe give them: text or typed) as ``cls`` types
    them, the same keys; checked as :func:`override` checks them (one-line ValueError)."""
    typed = override(cls, values, owner)
    return {key: getattr(typed, key) for key in values}


def typed_table(table: Any, kind: str, args: str, typer: Callable[[str, Mapping[str, Any]], dict]) -> Any:
    """A saved record's table with its plugin's settings ``table[args]`` typed as ``typer(table[kind], ...)``
    types them (runs before issue 38's fix recorded --set values as text); the table as it is where this
    code cannot type them (a renamed setting, a plugin it lacks), which then differs, as it should."""
    try:
        return {**table, args: typer(table[kind], table[args])}
    except (KeyError, TypeError, ValueError, AttributeError):
        return table


def group_fields(cls: type, *groups: str) -> tuple[str, ...]:
    """The names of ``cls``'s fields declared in ``groups`` (:func:`setting`'s ``group``), in declaration
    order: one group's settings taken as a whole (e.g. a run's data settings) instead of a hand list."""
    return tuple(f.name for f in flat_fields(cls) if f.metadata.get("group") in groups)


def union_fields(owners: Mapping[str, type], family: str, reserved: Mapping[str, str] | None = None
                 ) -> dict[str, dataclasses.Field]:
    """Every field of the settings classes ``owners`` (plugin name -> its settings dataclass) by name, in
    registry order: the flat settings of a plugin family, one flag each (every partition's, every
    dataset's). Two plugins may share a setting only with the same default; a name in ``reserved`` (the
    driver's own field -> the class that holds it) is refused. ValueError, one line."""
    fields: dict[str, dataclasses.Field] = {}
    owner: dict[str, str] = {}
    for name, cls in owners.items():
        for f in dataclasses.fields(cls):
            if f.name in (reserved or {}):
                raise ValueError(f"{family} {name!r} declares setting {f.name!r}, a {reserved[f.name]} field")
            if f.name in fields and field_default(fields[f.name]) != field_default(f):
                raise ValueError(f"{family}s {owner[f.name]!r} and {name!r} both declare setting {f.name!r} "
                                 f"with different defaults ({field_default(fields[f.name])!r}, "
                                 f"{field_default(f)!r})")
            fields.setdefault(f.name, f)
            owner.setdefault(f.name, name)
    return fields


def field_default(f: dataclasses.Field) -> Any:
    """The default of a field that has one (``default_factory`` called)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default
