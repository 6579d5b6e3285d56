"""Typed configuration of a pre-training run, with the paper's defaults (Chen et al., ICLR 2023, App. A.2).

:class:`PretrainConfig` is what defines the result: the same config gives the same weights on CPU, and
``--resume`` refuses a run directory whose config differs. :class:`RunOptions` says how to execute it
(device, workers, paths) and does not change the result on CPU. Every field carries its help, unit, source
and range (:func:`fpsfl.base.settings.setting`): the ``pretrain`` flags are generated from them. Fields in
the ``fractal``, ``multilabel`` and ``folder`` groups are flags only of the sources that use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fpsfl.base.rundir import RunFlags
from fpsfl.base.settings import check, override, setting, typed_overrides

from .backbones import arch_names
from .methods import METHODS, MethodConfig
from .probe import PROBES


@dataclass(frozen=True)
class Recipe:
    """The defaults ``pretrain --recipe NAME`` gives the self-supervised sources (fps, fractal-simsiam,
    images) where neither a flag nor a ``--config`` file sets them. ``method_args`` are settings of
    ``method`` (as ``--set`` gives them); they apply only when that method runs."""

    method: str
    init_scale: float
    text: str
    method_args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # how the fps source makes its pairs: PretrainConfig settings (--colours) and settings of ``method``
    # (--set flip_p); the other sources (fractal-single, images) do not get them
    pairs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def settings(self, source: str, method: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(PretrainConfig values, method settings) this recipe gives a run of ``method`` on ``source``,
        where no flag, ``--set`` or config file sets them; method settings go to the recipe's method only."""
        values: dict[str, Any] = {"init_scale": self.init_scale}
        args = dict(self.method_args) if method == self.method else {}
        for key, value in (self.pairs.items() if source == "fps" else ()):
            if key in _CONFIG_FIELDS:
                values[key] = value
            elif method == self.method:
                args[key] = value
        return values, args

    def flags(self) -> str:
        """Its settings as the flags that give them: ' --set temperature=0.5', then those of fps's pairs."""
        sets = "".join(f" --set {k}={v}" for k, v in self.method_args.items())
        pairs = " ".join(f"--{k} {v}" if k in _CONFIG_FIELDS else f"--set {k}={v:g}"
                         for k, v in self.pairs.items())
        return sets + (f" (fps: {pairs})" if pairs else "")


RECIPES = {
    # issue 38 (docs/pretraining.md, "Does it learn?"): at the official init and lr the backbone's weights
    # do not turn within a few thousand steps (spherical motion dynamics: lr / |w|^2 is tiny until weight
    # decay has shrunk |w| several-fold, ~25K steps); a 10x smaller init turns them from step 1, and
    # MoCo-v2's negatives keep the features from collapsing where SimSiam's fell to low rank. InfoNCE
    # temperature 0.5, not MoCo-v2's 0.2: over the same 1M pairs it beat 0.2 on the fair kNN (26.9 vs 23.0%),
    # linear (37.5 vs 36.3%) and digits probes (77.5 vs 69.4%) and in FedAvg from its weights (45.3 vs 40.9%,
    # 3 seeds; docs/pretraining.md, "The same schedule at temperature 0.5")
    "short": Recipe("mocov2", 0.1, "MoCo-v2 at InfoNCE temperature 0.5 from a backbone init scaled x0.1: "
                                   "learns within a few thousand steps (CPU budgets, up to ~1M pairs)",
                    MappingProxyType({"temperature": 0.5})),
    # short with the two views of a pair alike but for crop, jitter, grey and blur (docs/pretraining.md, "No
    # flip between the views"): FPS gives each view its own hue and its own of the square's 8 symmetries,
    # and the features learn to drop colour and orientation. Over 1M pairs, seeds 0-2, fair probe on every
    # image of the CIFAR-10 probe set: kNN 28.4 +- 1.4% against short's 25.8 +- 1.3 (random inits 0-2: 24.4),
    # the four CPU targets on the mean; seeds 3 and 4 scored kNN 27.6 and 21.9% and digits kNN 63.1
    # and 65.1%, so over five seeds kNN 26.9 +- 3.0%, short of random + 3 (27.4%). Not the default
    "aligned": Recipe("mocov2", 0.1, "short with the two views of an FPS pair aligned: coloured alike, "
                                     "every fractal placed as rendered, no flip between the views; the "
                                     "closest to issue 38's probe targets on 3 seeds, not on 5 "
                                     "(docs/pretraining.md)",
                      MappingProxyType({"temperature": 0.5}),
                      MappingProxyType({"colours": "shared", "flips": "none", "flip_p": 0.0})),
    # andytu28/FPS_Pre-training main_simsiam.py as it runs: SimSiam, He init, lr 0.05, wd 1e-4, cosine
    "official": Recipe("simsiam", 1.0, "the official FPS code's SimSiam at its He init (App. A.2); its "
                                       "backbone had not moved after 16K steps (cosine to init 0.9997)"),
}
DEFAULT_RECIPE = "short"


@dataclass(frozen=True)
class PretrainConfig:
    source: str = setting("fps", cli=False)  # fps | fractal-single | multilabel | images | supervised
    method: str = setting("simsiam", cli=False)  # §4.2: SimSiam (or MoCo-v2); --method, per source (cli)
    arch: str = setting("resnet20", lambda: f"backbone: {', '.join(arch_names())} (the paper's at 32 px)")
    width: float = setting(1.0, "channel multiplier of the CIFAR ResNets (Fig. 5)", within="(0, inf)")
    size: int = setting(32, "input side in px: 32 (CIFAR scale) or 224", within="[1, inf)")
    epochs: int = setting(100, "epochs (Appendix A.2)", within="[1, inf)")
    pairs_per_epoch: int = setting(1_000_000, "samples rendered per epoch (Appendix A.2)", within="[1, inf)",
                                   group="fractal")
    batch_size: int = setting(256, "pairs/images per step (Appendix A.2)", within="[1, inf)")
    seed: int = setting(0, "seed of weights, data and augmentation", within="[0, inf)")
    method_args: dict[str, Any] = setting(default_factory=dict, cli=False)  # --set / --lr overrides
    root: str | None = setting(None, "image folder (images: searched recursively; supervised: "
                                     "ROOT/<class>/<image>)", group="folder")
    format: str = setting("folder", "what --root holds: folder (image files) | imagenet32 (Chrabaszcz et "
                                    "al. 2017's down-sampled ImageNet as published: pickled "
                                    "train_data_batch_1..10, 1-based labels; the paper's ResNet20 'ImageNet' "
                                    "init, §4.2)", choices=("folder", "imagenet32"), group="folder")
    bank: str | None = setting(None, "IFS code bank .npz from `fractals bank`", group="fractal",
                               default_text="the paper's 100K codes sampled from --seed")
    look: str = setting("paper", "how fractals are rendered: paper (the official generator's: full-canvas "
                                 "render, 3x3 patches, colour then resize, 3x3 blur) or sparse (this "
                                 "project's first renderer)", choices=("paper", "sparse"), group="fractal")
    instances: str = setting("shared", "shared: each code of a pair rendered once and both views place that "
                                       "instance (the official generator's cache, issue 23); independent: "
                                       "each view renders its own", choices=("shared", "independent"),
                             group="fractal")
    colours: str = setting("own", "own: each view colours every fractal with its own hue, saturation and "
                                  "value (the official generator: FPS views differ in colour); shared: "
                                  "both views colour a fractal alike, so a pair differs in colour only by "
                                  "the image-level jitter (issue 38, docs/pretraining.md)",
                           choices=("own", "shared"), group="fractal",
                           default_text="own; --recipe aligned: shared")
    flips: str = setting("own", "own: each view flips or turns every fractal by its own one of the 8 "
                                "symmetries of the square (the paper look's default), so the features learn "
                                "to ignore a fractal's orientation; none: every fractal is placed as "
                                "rendered, so a pair differs in orientation only by the image-level "
                                "horizontal flip, which --recipe aligned also turns off (--set flip_p=0; "
                                "issue 38, docs/pretraining.md)",
                         choices=("own", "none"), group="fractal",
                         default_text="own; --recipe aligned: none")
    renderer: str = setting("auto", "who draws the fractals: torch (fractals.torch_render: batched tensor "
                                    "ops in the training process, on its --device), numba (the CPU "
                                    "renderer, in --workers processes) or auto (torch when training on a "
                                    "GPU and --look paper, else numba). They draw "
                                    "the same codes, and scenes equal in distribution, not bit for bit "
                                    "(docs/fractals.md)", choices=("auto", "torch", "numba"), group="fractal")
    n_classes: int = setting(1000, "J, the number of fractal classes (Anderson & Farrell 2022)",
                             flag="--classes", within="[1, inf)", group="multilabel")
    amp: bool = setting(False, "bf16 autocast (use on a GPU)")
    init_scale: float = setting(1.0, "multiply the backbone's initial conv/linear weights by this factor. "
                                     "Under BatchNorm the function does not change, but the weights turn "
                                     "1/scale^2 times faster per step (Wan et al. 2021): what lets a short "
                                     "schedule move the backbone (docs/pretraining.md, issue 38)",
                                within="(0, inf)", default_text="from --recipe: 0.1 short and aligned, "
                                                             "1 official")

    def __post_init__(self) -> None:
        METHODS.lookup(self.method)
        check(self)
        # typed now, not at step 1, and kept typed: --set temperature=0.5 and the short recipe's 0.5 are one
        # setting, so a run started either way resumes either way and records the number, not its text
        object.__setattr__(self, "method_args", typed_method_args(self.method, self.method_args))

    def method_config(self) -> MethodConfig:
        """The method's config with ``method_args`` applied; unknown keys and bad types are errors."""
        return override(METHODS[self.method].Config, self.method_args, self.method)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(PretrainConfig))


def typed_method_args(method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a method's settings as --set, a config file or a recipe give them: text or typed) as the
    method reads them; unknown keys and bad types are a one-line ValueError."""
    return typed_overrides(METHODS[method].Config, values, method)


RESUME_MODES = ("yes", "no", "auto")


@dataclass(frozen=True)
class RunOptions(RunFlags):
    resume: str | None = setting(None, "continue the run in the run directory from its last finished epoch: "
                                       "yes (a bare --resume), no, or auto (continue if it holds a training "
                                       "state, else start it: what a torchrun restart needs)",
                                 choices=RESUME_MODES, const="yes", group="run",
                                 default_text="auto under torchrun, else no")
    out: Path | None = setting(None, "checkpoint path", parse=Path, group="run",
                               default_text="<command>-<arch>.ckpt")  # the backbone checkpoint
    run_dir: Path | None = setting(None, "run directory: config.json, metrics.jsonl, state.pt", parse=Path,
                                   group="run", default_text="beside --out, fps.ckpt -> fps.run/")
    workers: int | None = setting(None, "data worker processes rendering fractals (numba; started once "
                                        "for the run) / decoding images",
                                  within="[0, inf)", group="run", default_text="0 on CPU, up to 8 on a GPU")
    dist_timeout: float = setting(30.0, "minutes a collective waits for a rank that died (or hangs) before "
                                        "the others fail; torchrun only (torch's NCCL default: 10)",
                                  within="(0, inf)", metavar="MIN", group="run")
    profile: bool = setting(False, "time data wait / augmentation / compute separately and print them as "
                                   "JSON", group="run")
    compile: bool = setting(False, "torch.compile the training step (forward, loss and backward; the "
                                   "optimiser stays eager, foreach on a GPU; on a GPU the augmentation too) "
                                   "and let cuDNN autotune its convolutions: meant for GPUs. The first "
                                   "steps pay the compilation (about a minute); results equal eager ones up "
                                   "to float rounding "
                                   "(docs/performance.md: Compiled steps)", group="run")
    cuda_graph: bool = setting(False, "capture the whole training step (the views made from their draws, "
                                      "forward, backward, SGD, the momentum encoder and key bank) as one "
                                      "CUDA graph and replay it for every batch: one launch instead of "
                                      "hundreds; CUDA and one process only, combines with --compile "
                                      "(docs/performance.md: CUDA graphs)",
                               group="run")
    probe: str | None = setting(None, "kNN-probe the backbone's frozen features on this labelled set while "
                                      "pre-training (metrics.jsonl: probe_knn_acc; the random init's: "
                                      "probe_init_knn_acc)", choices=tuple(PROBES), group="run",
                                default_text="no probe")
    probe_every: int = setting(1, "epochs between probes (and after the last)", within="[1, inf)",
                               group="run")
    keep_every: int | None = setting(None, "also keep the checkpoint of every N-th epoch beside --out "
                                           "(fps.ckpt -> fps.e0004.ckpt), e.g. for a pre-training budget "
                                           "study", within="[1, inf)", metavar="N", group="run",
                                     default_text="only the last")

    def __post_init__(self) -> None:
        check(self)


def default_run_dir(out: Path) -> Path:
    """The run directory beside ``out``: ``fps.ckpt`` -> ``fps.run/``."""
    return out.with_name(f"{out.stem}.run")
