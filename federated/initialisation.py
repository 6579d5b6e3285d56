"""Initialising the global model: random, an fpsfl pre-training checkpoint, or ImageNet/Places365 weights.

Chen et al., ICLR 2023 compare random initialisation with pre-training on ImageNet, Places365 and
synthetic FPS data (§4.2, §4.5). ``--init`` is ``random``, a ``pretrain`` checkpoint path, ``imagenet``
(torchvision weights from the local torch hub cache: there is no download here), or ``places365:FILE``: the
Places365 project's ``resnet18_places365.pth.tar`` as it publishes it (Zhou et al. 2017; a dict whose
``state_dict`` has ``module.``-prefixed keys of a torchvision ResNet18 with a 365-way ``fc``), the init
Chen et al. use for Tiny-ImageNet to avoid ImageNet's overlap with it (§4.1). ``--init-format torchvision``
reads any plain state-dict file instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import torch
from torch import nn

from fpsfl.base.checkpoint import CheckpointError, load_backbone_weights, load_checkpoint, load_weights_only
from fpsfl.base.files import file_sha256
from pretrain.backbones import create_backbone

from .partitions.report import indices_sha256

# torchvision's ImageNet weight files, as torch.hub stores them under <hub dir>/checkpoints/
IMAGENET_FILES = {
    "resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth",
    "mobilenet_v2": "https://download.pytorch.org/models/mobilenet_v2-b0353104.pth",
}


# checkpoints that ship with fpsfl, made by its own `pretrain` (weights/README.md says how each was made):
# the paper's recipe (Appendix A.2, a GPU run) and the CPU run of the short recipe, whose backbone moved and
# beats random init on the fair probe, at temperature 0.2 and 0.5, and the same recipe over two and four
# times the pairs on one H200 (issue 38; the two SimSiam files before them were their random init)
WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
SHIPPED = {"fps-resnet20": WEIGHTS / "fps-resnet20.ckpt",
           "fps-mocov2-resnet20": WEIGHTS / "fps-mocov2-resnet20.ckpt",
           "fps-mocov2-resnet20-cpu-1m": WEIGHTS / "fps-mocov2-resnet20-cpu-1m.ckpt",
           "fps-mocov2-t05-resnet20-cpu-1m": WEIGHTS / "fps-mocov2-t05-resnet20-cpu-1m.ckpt",
           "fps-mocov2-t05-resnet20-h200-2m": WEIGHTS / "fps-mocov2-t05-resnet20-h200-2m.ckpt",
           "fps-mocov2-t05-resnet20-h200-4m": WEIGHTS / "fps-mocov2-t05-resnet20-h200-4m.ckpt"}


def shipped_file(name: str) -> Path:
    """Where the shipped checkpoint ``name`` is: in this copy's weights/, else in the weights/ of the fpsfl
    checkout installed in this Python (``pip install -e``). A Flower app bundle (``flwr run .``) carries only
    source files, so the ServerApp's copy of the code has no weights/ of its own."""
    path = SHIPPED[name]
    if path.is_file():
        return path
    checkout = installed_checkout()
    there = checkout / "weights" / path.name if checkout else path
    return there if there.is_file() else path


def installed_checkout() -> Path | None:
    """The folder of the fpsfl checkout this Python has installed in editable mode, if any."""
    try:
        url = json.loads(distribution("fpsfl").read_text("direct_url.json") or "{}").get("url", "")
    except (PackageNotFoundError, ValueError):
        return None
    return Path(unquote(urlparse(url).path)) if url.startswith("file://") else None


def shipped_path(name: str) -> Path:
    """The file behind a shipped checkpoint name; an absent or unfinished one is a one-line error (a CPU run
    that ships in parts keeps its final name, but is refused until its last epoch is written)."""
    path = shipped_file(name)
    if not path.is_file() and not WEIGHTS.is_dir():  # a Flower app bundle, without an fpsfl checkout beside
        raise InitError(f"--init {name}: this copy of fpsfl ({WEIGHTS.parent}) has no weights/ (a Flower app "
                        f"bundle carries source files only) and no fpsfl checkout with {path.name} is "
                        f"installed here; pass the checkpoint's absolute path, e.g. "
                        f"init='/path/to/fpsfl/weights/{path.name}'")
    if not path.is_file():
        raise InitError(f"--init {name}: this copy of fpsfl ships no {path.name} (see weights/README.md); "
                        f"pre-train one (pretrain fps --epochs 100 --out fps.ckpt) and pass --init fps.ckpt")
    done, total = shipped_progress(path)
    if done < total:
        raise InitError(f"--init {name}: {path} is unfinished (epoch {done} of {total}); continue its run as "
                        f"weights/README.md says, or pass the file itself as --init {path}")
    return path


def shipped_progress(path: Path) -> tuple[int, int]:
    """(epochs written, epochs of its recipe) of a checkpoint file."""
    ckpt = load_checkpoint(path)
    return ckpt["epoch"], int(ckpt["config"].get("pretrain", {}).get("epochs", ckpt["epoch"]))


def shipped_ready(name: str) -> bool:
    """Whether the shipped checkpoint ``name`` exists and is finished."""
    path = shipped_file(name)
    if not path.is_file():
        return False
    done, total = shipped_progress(path)
    return done >= total


class InitError(ValueError):
    """An initialisation that cannot be used; the message is one line."""


PLACES365 = "places365:"  # --init places365:FILE, the Places365 project's published ResNet18 file
PLACES365_CLASSES = 365  # its fc's outputs: the file must be the Places365 classifier, not any ResNet18


def places365_file(init: str) -> Path | None:
    """The FILE of ``--init places365:FILE`` (None for any other --init)."""
    return Path(init[len(PLACES365):]).expanduser() if init.startswith(PLACES365) else None


def places365_state(path: Path) -> dict[str, torch.Tensor]:
    """The backbone state of the Places365 project's file: ``{"state_dict": {"module.conv1.weight": ...,
    "module.fc.weight": (365, 512), ...}, ...}`` (the epoch, arch and best accuracy beside it are ignored).
    Anything else is refused in one line: a plain ResNet18 file loads with --init-format torchvision."""
    record = load_weights_only(path, "Places365 ResNet18 file (resnet18_places365.pth.tar)", InitError)
    state = record.get("state_dict") if isinstance(record, dict) else None
    if not isinstance(state, dict):
        raise InitError(f"--init places365:{path}: no 'state_dict' entry, so not the Places365 project's "
                        f"resnet18_places365.pth.tar (a plain state dict loads with --init-format "
                        f"torchvision)")
    state = _tensors(state, f"--init places365:{path}")
    fc = state.get("fc.weight")
    if not isinstance(fc, torch.Tensor) or fc.shape[0] != PLACES365_CLASSES:
        shape = tuple(fc.shape) if isinstance(fc, torch.Tensor) else None
        raise InitError(f"--init places365:{path}: its fc.weight is {shape}, not the Places365 classifier's "
                        f"{PLACES365_CLASSES} outputs")
    return state


def _plain_state(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a plain weights file; unwraps {"state_dict": ...} and DataParallel prefixes."""
    state = load_weights_only(path, "plain state-dict file (weights_only=True)", InitError)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise InitError(f"{path} does not hold a state dict of tensors")
    return _tensors(state, str(path))


def _tensors(state: dict, where: str) -> dict[str, torch.Tensor]:
    """``state`` with DataParallel's ``module.`` prefixes removed, once every key is a name and every
    value a tensor (issue 42: other entries were tracebacks)."""
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise InitError(f"{where}: its state dict maps {key!r} to a {type(value).__name__}; a state dict "
                            f"maps tensor names to tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _finite(source: InitSource) -> InitSource:
    """Refuse (one line) weights that hold NaN or inf: training from them diverges at once, and the error
    then blamed the learning rate (issue 42)."""
    state = source.checkpoint["backbone"] if source.checkpoint is not None else source.state or {}
    bad = next((k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
    if bad is not None:
        raise InitError(f"--init {source.spec}: {bad} holds NaN or infinite values; these weights cannot be "
                        f"trained from")
    return source


def load_plain(backbone: nn.Module, path: Path, arch: str,
               state: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Load the backbone's tensors from a torchvision-style state dict (``path``'s unless ``state`` is
    given); classifier keys are skipped."""
    state = _plain_state(path) if state is None else state
    own = backbone.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    missing = sorted(set(own) - set(usable))
    if missing:
        raise InitError(f"{path} does not fit arch {arch!r}: {len(missing)} backbone tensors missing or "
                        f"mis-shaped, e.g. {missing[0]}")
    backbone.load_state_dict(usable)
    return sorted(usable)


def imagenet_path(arch: str) -> Path:
    if arch not in IMAGENET_FILES:
        raise InitError(f"--init imagenet has torchvision weights for {', '.join(IMAGENET_FILES)}, "
                        f"not {arch!r}")
    url = IMAGENET_FILES[arch]
    path = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[1]
    if not path.is_file():
        raise InitError(f"ImageNet weights for {arch} are not in the local cache: download {url} and put it "
                        f"at {path}")
    return path


def init_file(init: str) -> Path | None:
    """The file behind ``--init`` (None for random and imagenet); InitError if it does not exist."""
    if init in ("random", "imagenet"):
        return None
    path = places365_file(init) or (shipped_path(init) if init in SHIPPED else Path(init))
    if not path.is_file():
        raise InitError(f"--init {init}: no such file (use random, imagenet, {', '.join(SHIPPED)} or a "
                        f"checkpoint path)")
    return path


def init_sha256(init: str) -> str | None:
    """The SHA-256 of the --init file (recorded in config.json so that --resume need not compare paths);
    None for random, imagenet or a file that is no longer there."""
    try:
        path = init_file(init)
    except InitError:
        return None
    return None if path is None else file_sha256(path)


@dataclass(frozen=True)
class InitSource:
    """``--init`` resolved once (issue 39): what it names, its file and digest, and what the file holds,
    read from disk a single time and handed to every check and to :func:`initialise`.

    ``kind`` is random, imagenet, places365, torchvision (a plain state dict) or fpsfl (a ``pretrain`` or
    ``federate self-pretrain`` checkpoint); ``state`` the backbone tensors of the first four (None for
    random), ``checkpoint`` the fpsfl record."""

    spec: str
    kind: str
    path: Path | None = None
    sha256: str | None = None
    state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    checkpoint: dict | None = field(default=None, repr=False)


def resolve_init(init: str | InitSource, init_format: str = "fpsfl",
                 arch: str | None = None) -> InitSource:
    """Open ``--init`` once; InitError (one line) for a file that is absent or not what it claims. ``arch``
    picks ImageNet's file (only ``imagenet`` needs it)."""
    if isinstance(init, InitSource):
        return init
    if init == "random":
        return InitSource(init, "random")
    if init == "imagenet":
        path = imagenet_path(arch)
        return InitSource(init, "imagenet", path, file_sha256(path), _plain_state(path))
    path = init_file(init)
    if places365_file(init):
        return _finite(InitSource(init, "places365", path, file_sha256(path), places365_state(path)))
    if init_format == "torchvision":
        return _finite(InitSource(init, "torchvision", path, file_sha256(path), _plain_state(path)))
    return _finite(InitSource(init, "fpsfl", path, file_sha256(path), checkpoint=load_checkpoint(path)))


def pretraining_size(init: str | InitSource, init_format: str = "fpsfl") -> int | None:
    """The input side a ``pretrain`` checkpoint was pre-trained at (its config's ``pretrain.size``), or None
    for random, imagenet, a plain state dict, or a checkpoint that does not say."""
    if _not_fpsfl(init, init_format):
        return None
    source = resolve_init(init, init_format)
    size = source.checkpoint["config"].get("pretrain", {}).get("size")
    return int(size) if isinstance(size, int) else None


def _not_fpsfl(init: str | InitSource, init_format: str) -> bool:
    """Whether ``init`` is anything but an fpsfl checkpoint, decided without opening a file."""
    if isinstance(init, InitSource):
        return init.kind != "fpsfl"
    return init_format != "fpsfl" or init in ("random", "imagenet") or places365_file(init) is not None


def _partition_record(init: str | InitSource, init_format: str) -> tuple[InitSource | None, dict | None]:
    """The ``--init`` checkpoint's record of the partition it was self-pre-trained on (None: none)."""
    if _not_fpsfl(init, init_format):
        return None, None
    source = resolve_init(init, init_format)
    record = source.checkpoint["config"].get("partition")
    return source, record if isinstance(record, dict) else None


def check_partition(init: str | InitSource, init_format: str, settings: dict) -> None:
    """Refuse (one line) an ``--init`` checkpoint of federated self-pre-training (``federate self-pretrain``,
    Chen et al. §5) that saw another partition of the clients' data than this run's: other ``settings``
    (:func:`federated.shards.partition_settings`). Needs no data: the runner calls it before loading any.
    Checkpoints that record no partition pass."""
    source, record = _partition_record(init, init_format)
    if record is None:
        return
    theirs = record.get("settings", {})
    changed = sorted(k for k in settings.keys() | theirs.keys() if settings.get(k) != theirs.get(k))
    if changed:
        diffs = ", ".join(f"{k} {theirs.get(k)!r} (this run: {settings.get(k)!r})" for k in changed)
        raise InitError(f"--init {source.spec} was self-pre-trained on another partition of the clients' "
                        f"data: {diffs}; give federate the data and partition flags (and --seed) of that run")


def check_partition_indices(init: str | InitSource, init_format: str, parts: list[np.ndarray]) -> None:
    """The second half of :func:`check_partition`, once the data is loaded and partitioned: refuse an
    ``--init`` self-pre-trained with the same settings on other client samples than this run's ``parts``
    (compared by :func:`federated.partitions.indices_sha256`, taken only for such a checkpoint)."""
    source, record = _partition_record(init, init_format)
    if record is None or record.get("indices_sha256") is None:
        return
    if record["indices_sha256"] != indices_sha256(parts):
        raise InitError(f"--init {source.spec} was self-pre-trained with these partition settings but on "
                        f"other client samples (the indices' sha256 differ: has the dataset changed?)")


def init_warning(init: str | InitSource, init_format: str = "fpsfl") -> str | None:
    """One line when ``--init`` is an fpsfl checkpoint whose backbone barely moved from its random init
    (:func:`pretrain.signals.verdict`, issue 38); None otherwise (random, ImageNet, Places365, torchvision
    files, and checkpoints that do not record their init)."""
    if _not_fpsfl(init, init_format):
        return None
    from pretrain.signals import checkpoint_drift, verdict

    source = resolve_init(init, init_format)
    drift = checkpoint_drift(source.checkpoint)
    line = verdict(drift) if drift else None
    return f"--init {source.spec} ({source.path.name}) is {line}" if line else None


def check_init(arch: str, width: float, init: str | InitSource, init_format: str = "fpsfl") -> None:
    """Everything :func:`initialise` checks (the file exists, loads, matches arch and width tensor by
    tensor), on a throw-away backbone and without touching the global RNG: run before slow data loading."""
    source = resolve_init(init, init_format, arch)
    if source.kind == "random":
        return
    with torch.random.fork_rng(devices=[]):
        initialise(create_backbone(arch, width), arch, width, source)


def initialise(backbone: nn.Module, arch: str, width: float, init: str | InitSource,
               init_format: str = "fpsfl") -> str:
    """Load ``init`` (a spec, opened now, or an :class:`InitSource` already read) into ``backbone``;
    returns a one-line description of what was loaded."""
    source = resolve_init(init, init_format, arch)
    path = source.path
    if source.kind == "random":
        return "random initialisation"
    if source.kind == "imagenet":
        names = load_plain(backbone, path, arch, source.state)
        return f"ImageNet weights (torchvision): {len(names)} backbone tensors loaded"
    if source.kind == "places365":
        names = load_plain(backbone, path, arch, source.state)
        return f"Places365 ResNet18 ({path}): {len(names)} backbone tensors loaded"
    if source.kind == "torchvision":
        names = load_plain(backbone, path, arch, source.state)
        return f"{path} (torchvision state dict): {len(names)} backbone tensors loaded"
    ckpt = source.checkpoint
    if ckpt["arch"] != arch or abs(ckpt["width"] - width) > 1e-9:
        raise CheckpointError(f"{path} holds a {ckpt['arch']} (width {ckpt['width']:g}) backbone, but the "
                              f"run uses --arch {arch} (width {width:g})")
    names = load_backbone_weights(backbone, ckpt, str(path))
    return (f"{path} ({ckpt['method']} on {ckpt['source']}, epoch {ckpt['epoch']}): "
            f"{len(names)}/{len(backbone.state_dict())} backbone tensors loaded")
