"""Where analyses write: PNG figures (matplotlib, Agg) and JSON beside them.

With one run the default output folder is ``RUN/figures``; with several it is ``./analysis``. Figures are
FIGSIZE inches at DPI, so every PNG has a known pixel size (tests check it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

from fpsfl.base.cli import writable_dir

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIGSIZE = (6.0, 4.0)  # inches
DPI = 100  # so a figure is 600 x 400 px


def output_dir(out: str | None, runs: list) -> Path:
    """``out`` if given, else RUN/figures for one run, else ./analysis; created and checked writable."""
    path = Path(out) if out else (runs[0].path / "figures" if len(runs) == 1 else Path("analysis"))
    return writable_dir(path)


def new_figure(ncols: int = 1):
    """A figure of FIGSIZE (wider with several panels) and its axes."""
    fig, axes = plt.subplots(1, ncols, figsize=(FIGSIZE[0] * ncols, FIGSIZE[1]), dpi=DPI, squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG of its exact size (no tight cropping) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
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
    path.write_text(json.dumps(_finite(obj), indent=1) + "\n")
    return path
