"""Every list of registered names written out by hand (bench, recipes, pyproject, docs) names exactly what
the registry holds (issue 39): adding an algorithm, method, dataset or partition without updating them
fails here, naming the file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from federated.algorithms import ALGORITHMS
from federated.datasets import DATASETS
from federated.partitions import PARTITIONS
from pretrain.methods import METHODS
from pretrain.sources import SOURCES

ROOT = Path(__file__).resolve().parents[1]


def _text(path: str) -> str:
    return (ROOT / path).read_text()


def fig4_algorithms() -> set[str]:
    """recipes/fig4_algorithms.sh: the paper's ALGOS plus the EXTRA ones."""
    text = _text("recipes/fig4_algorithms.sh")
    base = re.search(r'ALGOS=\$\{ALGOS:-([^}]*)\}', text).group(1).split()
    extra = re.search(r'ALGOS="\$ALGOS ([^"]*)"', text).group(1).split()
    return set(base) | set(extra)


def pyproject_choices(key: str) -> set[str]:
    """pyproject.toml's ``[tool.flwr.app.config]`` comment ``key = "x"  # a | b | c``."""
    line = re.search(rf'^{key} = .*#(.*)$', _text("pyproject.toml"), re.M).group(1)
    return {w.strip() for w in line.split("|")}


def _section(path: str, heading: str) -> str:
    return _text(path).split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def docs_table(path: str, heading: str) -> set[str]:
    """The first column (`` `name` ``) of the table under ``## heading`` in a docs page."""
    return set(re.findall(r"^\| `([a-z0-9_-]+)` \|", _section(path, heading), re.M))


def docs_first_paragraph(path: str, heading: str) -> set[str]:
    """The names in backticks (not flags, not files) of the first paragraph under ``## heading``."""
    paragraph = _section(path, heading).strip().split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z][a-z0-9_-]*)`", paragraph))


def docs_dataset_layouts() -> set[str]:
    """docs/federated.md "Preparing each dataset": the names that start each layout line (``a / b``)."""
    block = _text("docs/federated.md").split("### Preparing each dataset", 1)[1].split("```")[1]
    names = set()
    for line in block.splitlines():
        if line and not line[0].isspace():
            names |= set(line.split("  ")[0].replace(" ", "").split("/"))
    return names


def docs_pretrain_commands() -> set[str]:
    """docs/pretraining.md's opening examples: the subcommands of ``pretrain SUBCOMMAND ...``."""
    block = _text("docs/pretraining.md").split("```bash", 1)[1].split("```", 1)[0]
    return set(re.findall(r"^pretrain ([a-z-]+)", block, re.M))


def bench_reads_the_registry() -> set[str]:
    """bench/algorithms.sh takes its default list from the registry itself."""
    text = _text("bench/algorithms.sh")
    assert "from federated.algorithms import ALGORITHMS" in text, "bench/algorithms.sh lists them by hand"
    return set(ALGORITHMS)


LISTS = {
    "bench/algorithms.sh": (bench_reads_the_registry, ALGORITHMS),
    "recipes/fig4_algorithms.sh (ALGOS + EXTRA)": (fig4_algorithms, ALGORITHMS),
    "pyproject.toml algo": (lambda: pyproject_choices("algo"), ALGORITHMS),
    "docs/federated.md ## Algorithms": (lambda: docs_table("docs/federated.md", "Algorithms"), ALGORITHMS),
    "docs/pretraining.md ## Defaults (methods)": (
        lambda: docs_table("docs/pretraining.md", "Defaults"), METHODS),
    "docs/pretraining.md examples (subcommands)": (
        docs_pretrain_commands, {spec.cli_name for spec in SOURCES.values()}),
    "docs/federated.md ## Datasets": (
        lambda: docs_first_paragraph("docs/federated.md", "Datasets"), DATASETS),
    "docs/federated.md dataset layouts": (docs_dataset_layouts, DATASETS),
    "docs/federated.md ## Partitions": (
        lambda: docs_first_paragraph("docs/federated.md", "Partitions"), PARTITIONS),
}


@pytest.mark.parametrize("where", list(LISTS))
def test_a_hand_list_names_what_the_registry_holds(where):
    read, registry = LISTS[where]
    written = read()
    assert written == set(registry), (f"{where} lists {sorted(written)}; the registry holds "
                                      f"{sorted(registry)}")


def test_a_missing_name_is_found(tmp_path, monkeypatch):
    """The readers see what the files say: a table without one algorithm reads as a smaller set."""
    page = tmp_path / "docs" / "x.md"
    page.parent.mkdir()
    page.write_text("## Algorithms\n\n| name | x |\n|---|---|\n| `fedavg` | a |\n\n## Next\n| `moon` | b |\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert docs_table("docs/x.md", "Algorithms") == {"fedavg"}
