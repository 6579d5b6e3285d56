"""The plugins' flags, shared by ``federate`` and ``federate self-pretrain``: one flag per setting of the
registered partitions (Chen et al., ICLR 2023, §4.2 and Appendix A) and datasets (``--split-csv``,
``--crop-size``), generated from the settings classes each declares in its own file.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable

from fpsfl.base.cli import add_settings, settings_from
from fpsfl.base.settings import flat_fields

from .datasets import DATASETS
from .experiment import FederateConfig
from .partitions import PARTITIONS


def plugin_settings_classes() -> list[type]:
    """The settings classes of every registered partition and dataset (their fields are the plugins'
    flags, which FederateConfig takes flat)."""
    classes = [cls.Config for cls in PARTITIONS.values()] + [spec.settings for spec in DATASETS.values()]
    return list(dict.fromkeys(classes))


def plugin_settings_from(args: argparse.Namespace) -> dict:
    """The partitions' and datasets' settings given on the command line, by name."""
    return {k: v for cls in plugin_settings_classes() for k, v in settings_from(args, cls).items()}


def add_plugin_flags(parser: argparse.ArgumentParser, groups: dict | None = None) -> None:
    """One flag per setting of the registered partitions and datasets (a setting two plugins share, or one
    that is a FederateConfig field, is one flag); a dataset's flag goes in its field's group."""
    seen = {f.name for f in flat_fields(FederateConfig)}
    for settings in plugin_settings_classes():
        for f in dataclasses.fields(settings) if groups is not None else ():  # a plugin's own help section
            group = f.metadata.get("group")
            if group and group not in groups:
                groups[group] = parser.add_argument_group(group)
        add_settings(parser, settings, groups=groups, skip=tuple(seen))
        seen |= {f.name for f in dataclasses.fields(settings)}


def unread_settings(given: Iterable[str], partition: str, dataset: str) -> list[str]:
    """A note for each plugin setting in ``given`` (flags typed by the user) that neither the run's
    partition nor its dataset reads: ``--partition iid --alpha 0.5`` runs IID, and says so."""
    owners: dict[str, list[str]] = {}
    for name, cls in PARTITIONS.items():
        for f in dataclasses.fields(cls.Config):
            owners.setdefault(f.name, []).append(f"--partition {name}")
    for name, spec in DATASETS.items():
        for f in dataclasses.fields(spec.settings):
            owners.setdefault(f.name, []).append(f"--dataset {name}")
    read = {f.name for f in dataclasses.fields(PARTITIONS[partition].Config)}
    read |= {f.name for f in dataclasses.fields(DATASETS[dataset].settings)}
    core = {f.name for f in flat_fields(FederateConfig)}
    return [f"--{key.replace('_', '-')} is a setting of {' and '.join(owners[key])}; this run "
            f"(--partition {partition}, --dataset {dataset}) does not read it"
            for key in given if key in owners and key not in read | core]
