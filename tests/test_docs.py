"""The front door: a short README whose links and anchors, and those of docs/, lead somewhere on GitHub.

The site build (`mkdocs build --strict` in .ci/run) checks docs/ as the site renders it; these tests check
the markdown as GitHub renders it (its heading anchors), the README included, without mkdocs installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250  # issue 34: a README a newcomer reads in five minutes

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (GitHub numbers repeated ones -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = github_slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def broken_links(path: Path) -> list[str]:
    """Relative links of a markdown file whose file is not in the repository or whose anchor is not there."""
    bad = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or not dest.resolve().is_relative_to(ROOT):
            bad.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.name}: {target} (no such heading)")
    return bad


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_lead_somewhere(page):
    assert broken_links(page) == []


def test_the_link_check_finds_a_broken_file_and_a_broken_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title: `code` here\n\n## Two words\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#title-code-here) [ok](a.md#two-words) [ok](#local)\n\n## Local\n"
                    "[no](a.md#nowhere) [no](missing.md)\n```\n[in code](ignored.md)\n```\n")
    assert broken_links(page) == ["b.md: a.md#nowhere (no such heading)", "b.md: missing.md (no such file)"]


def test_github_slugs():
    assert github_slug("Vectorised clients: `--client-batch K`") == "vectorised-clients---client-batch-k"
    assert github_slug("GPU verification: `bash bench/gpu.sh`") == "gpu-verification-bash-benchgpush"


def test_every_page_is_in_the_site_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert f": {page.relative_to(ROOT / 'docs').as_posix()}\n" in nav, page


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="the docs extra is not installed")
def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    done = subprocess.run([mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
