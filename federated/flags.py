"""The plugins' flags, shared by ``federate`` and ``federate self-pretrain``: one flag per setting of the
registered partitions (Chen et al., ICLR 2023, §4.2 and Appendix A) and datasets (``--split-csv``,
``--crop-size``), generated from the settings classes each declares in its own file.
"""

from __future__ import annotations

import argparse
import dataclasses

from fpsfl.base.cli import add_settings

from .datasets import DATASETS
from .experiment import FederateConfig
from .partitions import PARTITIONS


def plugin_settings_classes() -> list[type]:
    """The settings classes of every registered partition and dataset (their fields are the plugins'
    flags, which FederateConfig takes flat)."""
    classes = [cls.Config for cls in PARTITIONS.values()] + [spec.settings for spec in DATASETS.values()]
    return list(dict.fromkeys(classes))


def add_plugin_flags(parser: argparse.ArgumentParser, groups: dict | None = None) -> None:
    """One flag per setting of the registered partitions and datasets (a setting two plugins share, or one
    that is a FederateConfig field, is one flag); a dataset's flag goes in its field's group."""
    seen = {f.name for f in dataclasses.fields(FederateConfig)}
    for settings in plugin_settings_classes():
        for f in dataclasses.fields(settings) if groups is not None else ():  # a plugin's own help section
            group = f.metadata.get("group")
            if group and group not in groups:
                groups[group] = parser.add_argument_group(group)
        add_settings(parser, settings, groups=groups, skip=tuple(seen))
        seen |= {f.name for f in dataclasses.fields(settings)}
