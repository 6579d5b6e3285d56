"""Typed settings and registries (fpsfl.base): ranges, coercion, the one --set helper, generated flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from fpsfl.base.cli import Parser, UsageError, add_settings, comma_list, settings_from
from fpsfl.base.registry import Registry
from fpsfl.base.settings import check, coerce, in_interval, override, setting


@dataclass(frozen=True)
class Toy:
    rate: float = setting(0.1, "a rate (per step)", within="(0, 1]")
    count: int = setting(3, "how many", within="[1, inf)")
    mode: str = setting("a", "a | b", choices=("a", "b"))
    tag: str | None = setting(None, "an optional tag", default_text="none")
    fast: bool = setting(False, "go fast")
    slow: bool = setting(True, "do not go slow", flag="--no-slow")
    rounds: tuple[int, ...] = setting((), "rounds", parse=comma_list(int), within="[1, inf)")
    hidden: int = setting(0, cli=False)

    def __post_init__(self) -> None:
        check(self)


@pytest.mark.parametrize("value,interval,inside", [
    (0.5, "(0, 1]", True), (1.0, "(0, 1]", True), (0.0, "(0, 1]", False), (1e9, "[1, inf)", True),
    (float("nan"), "[0, inf)", False), (float("inf"), "[0, inf)", False), (True, "[0, 1]", False),
    (-1, "[0, inf)", False)])
def test_intervals(value, interval, inside):
    assert in_interval(value, interval) is inside


def test_check_names_the_flag_or_the_setting():
    with pytest.raises(ValueError, match=r"--rate must lie in \(0, 1\], got 0"):
        Toy(rate=0)
    with pytest.raises(ValueError, match="--mode must be one of a, b"):
        Toy(mode="c")
    with pytest.raises(ValueError, match=r"--rounds must lie in \[1, inf\)"):
        Toy(rounds=(2, 0))


def test_override_types_checks_and_refuses_unknown_keys():
    assert override(Toy, {"rate": "0.5", "count": "7", "fast": "true", "tag": "none"}, "toy") == Toy(
        rate=0.5, count=7, fast=True)
    with pytest.raises(ValueError, match="toy has no setting 'speed'; it has"):
        override(Toy, {"speed": "1"}, "toy")
    with pytest.raises(ValueError, match="setting 'count' must be a int"):
        override(Toy, {"count": "many"}, "toy")
    with pytest.raises(ValueError, match=r"^toy: --rate must lie"):
        override(Toy, {"rate": "2"}, "toy")
    assert coerce("r", "1,2", tuple[int, ...]) == (1, 2)


def test_generated_flags_leave_absent_fields_to_the_dataclass():
    p = Parser(prog="toy")
    add_settings(p, Toy)
    assert settings_from(p.parse_args([]), Toy) == {}
    args = p.parse_args(["--rate", "0.2", "--mode", "b", "--fast", "--no-slow", "--rounds", "1,5"])
    assert Toy(**settings_from(args, Toy)) == Toy(rate=0.2, mode="b", fast=True, slow=False, rounds=(1, 5))
    text = p.format_help()
    assert "a rate (per step) (default: 0.1)" in text and "--hidden" not in text and "(default: none)" in text
    with pytest.raises(UsageError, match="invalid choice"):
        p.parse_args(["--mode", "c"])
    with pytest.raises(UsageError):
        p.parse_args(["--rounds", "x"])


def test_a_registry_discovers_lists_sorted_and_refuses_unknown_names():
    reg: Registry = Registry("widget")
    reg.register(argparse.Namespace(name="b"))
    reg.register(argparse.Namespace(), name="a")
    assert list(reg) == ["a", "b"]
    with pytest.raises(KeyError):
        reg.lookup("c", KeyError)
    with pytest.raises(ValueError, match="unknown widget 'c'; choose from a, b"):
        reg.lookup("c")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(argparse.Namespace(), name="a")
    reg.unregister("a")
    assert list(reg) == ["b"]
