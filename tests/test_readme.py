"""The README's two quickstart commands: complete set-up each, and CI runs the second one verbatim."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fenced_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(re.escape(f"<!-- {marker} -->") + r"\n```bash\n(.+)\n```", text)
    assert match, marker
    return match.group(1)


def test_ci_runs_the_quickstart_test_command_verbatim():
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert printed == _fenced_after("ci:test")
    assert 'bash -euo pipefail -c "$test_cmd"' in (ROOT / ".ci" / "run").read_text()


def test_both_quickstart_commands_set_up_from_scratch():
    demo, tests = _fenced_after("quickstart:demo"), _fenced_after("ci:test")
    for command in (demo, tests):
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install torch==")
    assert demo.endswith("fpsfl demo --out runs/demo")
    assert tests.endswith("python -m pytest -n 2") and '".[test' in tests


def test_ci_installs_the_docs_tools_and_builds_the_site_strictly():
    assert "docs" in _fenced_after("ci:test").split('".[')[1].split(']"')[0].split(",")
    run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\.venv/bin/mkdocs build --strict .*--site-dir \"\$site\"$", run, re.M)
    assert run.index("mkdocs build") > run.index('bash -euo pipefail -c "$test_cmd"')
