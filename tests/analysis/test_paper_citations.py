"""Every number of analysis/paper_numbers.csv cites a table and row of Chen et al., ICLR 2023 that exist, and
its own (issue 41): the cite names the CSV row's table (``sec4.5`` is §4.5) and row, the table is in the
paper, and the row's label and value appear in the paper's text (../shared/papers, beside the checkout)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "analysis" / "paper_numbers.csv"
PAPER = ROOT.parent / "shared" / "papers" / "003_6350176bbf211fdd.txt"  # Chen et al. (papers/README.md)


def rows() -> list[dict]:
    with CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def cited_table(cite: str) -> str:
    """``Table 2 (...)`` -> table2; ``§4.5 ...`` -> sec4.5; the first table a cite names."""
    match = re.search(r"Table (\d+)|§(\d+\.\d+)", cite)
    assert match, f"cite names no table or section: {cite!r}"
    return f"table{match.group(1)}" if match.group(1) else f"sec{match.group(2)}"


def problems(row: dict, paper: str) -> list[str]:
    """Why ``row`` of the CSV does not resolve in the paper's text (empty: it does)."""
    cite, out = row["cite"], []
    if cited_table(cite) != row["table"]:
        out.append(f"cites {cited_table(cite)}, not its table {row['table']}")
    label = row["row"].removesuffix(" + SP")  # Table 7's with-SP cells: its "w/ SP" column of that row
    cited = cite.split(", row ", 1)[1].replace(" (ours)", "") if ", row " in cite else label
    if not cited.startswith(label):  # the cite may say more ("Random with SP", "Real (ImageNet for C10)")
        out.append(f"cites row {cited!r}, not {row['row']!r}")
    if row["table"].startswith("table") and not re.search(rf"Table {row['table'][5:]}\b", paper):
        out.append(f"the paper has no Table {row['table'][5:]}")
    if label not in paper:
        out.append(f"row {label!r} is not in the paper")
    if not re.search(rf"(?<![\d.]){re.escape(row['value'])}(?!\d)", paper):
        out.append(f"value {row['value']} is not in the paper")
    return out


@pytest.fixture(scope="module")
def paper() -> str:
    if not PAPER.is_file():
        pytest.skip(f"{PAPER} is not beside this checkout")
    return PAPER.read_text()


def test_every_number_resolves_to_its_table_and_row(paper):
    bad = {f"{r['table']}/{r['row']}/{r['column']}": p for r in rows() if (p := problems(r, paper))}
    assert bad == {}
    assert len(rows()) >= 90


def test_a_wrong_citation_is_found(paper):
    row = {"table": "table2", "row": "FPS", "column": "Federated", "value": "84.9",
           "cite": "Table 3, row FPS"}
    assert problems(row, paper) == ["cites table3, not its table table2"]
    assert problems({**row, "cite": "Table 2, row FPS", "value": "84.95"}, paper) == [
        "value 84.95 is not in the paper"]
