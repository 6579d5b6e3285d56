"""mkdocs hook: links from a page to repository files outside docs/ (``../weights/README.md``).

They read well on GitHub, where the file is one click away, but the site holds only docs/. The hook checks
that each such file exists (a missing one fails the build, as a broken link inside docs/ does under
``--strict``) and renders the link as the file's repository path in code.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = (docs / page.file.src_path).parent

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("mailto:"):
            return match.group(0)
        path = (here / target).resolve()
        if path.is_relative_to(docs):
            return match.group(0)  # mkdocs checks these itself
        if not path.is_relative_to(root) or not path.exists():
            raise PluginError(f"{page.file.src_path}: link to {target}, not a file of the repository")
        return f"{match.group(1)} (`{path.relative_to(root).as_posix()}`)"

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):  # leave code blocks alone
        parts.append(LINK.sub(rewrite, markdown[last:fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(parts)
