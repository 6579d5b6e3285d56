"""The partition flags, shared by ``federate`` and ``federate self-pretrain``: one flag per setting of the
registered partitions (Chen et al., ICLR 2023, §4.2 and Appendix A), generated from their Config fields.
"""

from __future__ import annotations

import argparse
import dataclasses

from fpsfl.base.cli import add_settings

from .experiment import FederateConfig
from .partitions import PARTITIONS


def partition_settings_classes() -> list[type]:
    """The Config classes of every registered partition (their fields are the partition flags)."""
    return [cls.Config for cls in PARTITIONS.values()]


def add_partition_flags(parser: argparse.ArgumentParser, groups: dict | None = None) -> None:
    """One flag per setting of the registered partitions (a setting two partitions share, or one that is a
    FederateConfig field, is one flag)."""
    seen = {f.name for f in dataclasses.fields(FederateConfig)}
    for settings in partition_settings_classes():
        add_settings(parser, settings, groups=groups, skip=tuple(seen))
        seen |= {f.name for f in dataclasses.fields(settings)}
