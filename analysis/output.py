"""Where analyses write: PNG figures (matplotlib, Agg) and JSON beside them.

The default output folder lies beside the inputs, never in the working directory (from a clone's root,
``./analysis`` is this package): ``RUN/figures`` for one run, ``<their common parent>/analysis`` for several
runs or for checkpoints. Figures are FIGSIZE inches at DPI, so every PNG has a known pixel size (tests
check it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import matplotlib

from fpsfl.base.cli import UsageError, writable_dir
from fpsfl.base.files import atomic_write

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT_HELP = "output folder (default RUN/figures for one run, else analysis/ in the runs' common parent)"
FIGSIZE = (6.0, 4.0)  # inches
DPI = 100  # so a figure is 600 x 400 px


FORCE_HELP = "replace the files an earlier analysis left in the output folder (refused without it)"


def output_dir(out: str | None, runs: list, inputs: list[str | Path] = (), writes: tuple[str, ...] = (),
               force: bool = False) -> Path:
    """``out`` if given, else RUN/figures for one run, else ``<common parent>/analysis`` of the runs'
    folders or of ``inputs`` (checkpoint files); created and checked writable. A file of ``writes`` (the
    names the command will write) that is there already is refused in one line unless ``force``: a second
    analysis into the same folder (two reports of other runs beside each other) never replaces the first
    one's silently. Call it once the inputs are checked: a command that fails on its input leaves no folder
    behind."""
    if out:
        folder = Path(out)
    elif len(runs) == 1 and not inputs:
        folder = runs[0].path / "figures"
    else:
        folder = default_dir([run.path for run in runs] + [Path(p).parent for p in inputs])
    there = [name for name in writes if (folder / name).exists()]
    if there and not force:
        raise UsageError(f"{folder / there[0]} is there already (an earlier analysis); --force replaces "
                         f"it, or another --out")
    return writable_dir(folder)


def default_dir(folders: list[Path]) -> Path:
    """``<common parent of folders>/analysis``; refused when that is a Python package (a clone's root)."""
    if not folders:
        raise UsageError("no input to put the output beside; give --out")
    parent = Path(os.path.commonpath([f.resolve() for f in folders]))
    path = parent / "analysis"
    if (path / "__init__.py").exists():
        raise UsageError(f"the default output folder {path} is a Python package (the runs' common parent "
                         f"{parent} looks like a source tree); give --out")
    return path


def new_figure(ncols: int = 1):
    """A figure of FIGSIZE (wider with several panels) and its axes."""
    fig, axes = plt.subplots(1, ncols, figsize=(FIGSIZE[0] * ncols, FIGSIZE[1]), dpi=DPI, squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG of its exact size (no tight cropping) and close it."""
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format=Path(path).suffix[1:] or "png"))
    plt.close(fig)
    return path


def _finite(value: Any) -> Any:
    """JSON has no NaN: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, obj: Any) -> Path:
    text = json.dumps(_finite(obj), indent=1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))
    return path
