"""The partition as run-directory artifacts: ``partition.json`` and a clients x classes ``partition.png``.

``partition.json`` holds the config, :func:`federated.partitions.summary` (sizes, per-client class counts)
and a sha256 of the index arrays, so two runs can be checked for the same split without storing the indices.
Both files are written atomically (temporary file beside, then rename).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fpsfl.base.checkpoint import atomic_write

from .base import PartitionError
from .driver import client_noise, summary
from .request import PartitionConfig, headline

_ANNOTATE_CELLS = 400  # write the count in each cell up to this many cells (e.g. 20 clients x 20 classes)


def indices_sha256(parts: list[np.ndarray]) -> str:
    """sha256 of the client index arrays concatenated in client order as little-endian int64.

    The boundaries are not hashed; ``partition.json`` records them as ``sizes``.
    """
    h = hashlib.sha256()
    for p in parts:
        h.update(np.ascontiguousarray(p, dtype="<i8").tobytes())
    return h.hexdigest()


def _dumps(record: dict) -> str:
    """JSON with one line per dict key; lists stay on one line (class counts would take one line per int)."""
    def value(v: object, indent: str) -> str:
        if not isinstance(v, dict):
            return json.dumps(v)
        inner = indent + " "
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {value(x, inner)}" for k, x in v.items()) + \
            f"\n{indent}}}"
    return value(record, "") + "\n"


def partition_figure(counts: np.ndarray, cfg: PartitionConfig):
    """Heatmap of ``counts`` (clients, classes) on a symmetric-log colour scale (zero stays visible)."""
    # matplotlib (~0.3 s) only when a run writes its report, not when federate starts or prints --help
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import SymLogNorm
    from matplotlib.figure import Figure

    clients, classes = counts.shape
    size = (float(np.clip(2.5 + 0.4 * classes, 6, 16)), float(np.clip(1.8 + 0.3 * clients, 4, 12)))  # inches
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    vmax = max(int(counts.max(initial=0)), 1)
    im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis",
                   norm=SymLogNorm(linthresh=1, vmin=0, vmax=vmax))
    fig.colorbar(im, ax=ax, label="samples (symlog scale)")
    if counts.size <= _ANNOTATE_CELLS:
        for (i, j), v in np.ndenumerate(counts):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                    color="white" if v < vmax ** 0.5 else "black")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    param = headline(cfg.name)
    detail = f", {param}={getattr(cfg, param)}" if param else ""
    ax.set_title(f"{cfg.name} partition{detail}: {clients} clients, {int(counts.sum())} samples")
    return fig


def write_partition_report(run_dir: Path, parts: list[np.ndarray], labels: np.ndarray, n_classes: int,
                           cfg: PartitionConfig) -> None:
    """Write ``run_dir/partition.json`` and ``run_dir/partition.png``, each atomically."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    info = summary(parts, labels, n_classes)
    record = {"config": cfg.to_dict(), "summary": info, "indices_sha256": indices_sha256(parts),
              "client_noise": [client_noise(cfg, i) for i in range(len(parts))]}  # sigma, [0,1] pixel units
    atomic_write(run_dir / "partition.json", lambda p: p.write_text(_dumps(record)))
    counts = np.asarray(info["class_counts"], dtype=np.int64).reshape(len(parts), n_classes)
    fig = partition_figure(counts, cfg)
    atomic_write(run_dir / "partition.png", lambda p: fig.savefig(p, format="png", dpi=100))


def check_partition_report(run_dir: Path, parts: list[np.ndarray]) -> None:
    """Refuse to resume a run whose partition is no longer the one it started with (the dataset at
    --data-root changed, or the code that draws partitions): ``partition.json``'s indices hash must be
    ``parts``'. A run without the file (it was removed) is not checked."""
    path = Path(run_dir) / "partition.json"
    try:
        saved = json.loads(path.read_text()).get("indices_sha256")
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError) as exc:
        raise PartitionError(f"--resume: {path} is unreadable ({exc}); start a new run") from None
    if saved != indices_sha256(parts):
        raise PartitionError(f"--resume: the partition drawn now differs from the one in {path} (its "
                             f"indices_sha256): the data or the partition code changed; start a new run")


__all__ = ["check_partition_report", "indices_sha256", "partition_figure", "write_partition_report"]
