"""Which stage specialises? A checkpoint's one stage moved back toward its init (issue 38's diagnostic).

For each ``--alpha``, writes a copy of a ``pretrain`` checkpoint whose stage ``--stage`` (every parameter
and buffer of it: conv weights and BatchNorm) is ``init + alpha * (trained - init)``, the init being the one
the run started from (:func:`pretrain.signals.initial_state`: its seed and ``--init-scale``); the other
stages stay as trained. alpha 0 puts the stage back at its init, 1 leaves the file as it was. Probe the
copies with ``analyze probe``: if the trained early stages carry general features and the last stage turns
them into task-specific ones, the kNN rises as alpha falls. The copies are diagnostics, not weights: at
alpha 0 the deepest stage is its init, and ``analyze probe`` says so.

    python bench/stage_reset.py weights/fps-mocov2-t05-resnet20-cpu-1m.ckpt --alpha 0 0.5 --out /tmp/reset
    analyze probe /tmp/reset/*.ckpt --dataset digits --folds 5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fpsfl.base.checkpoint import load_checkpoint
from pretrain.signals import initial_state, stage_of


def reset_stage(ckpt: dict, stage: str, alpha: float) -> dict:
    """A copy of ``ckpt`` with ``stage`` moved to ``init + alpha * (trained - init)``; integer buffers
    (BatchNorm's batch counts) are the trained ones. Drops the recorded signals, which describe the file as
    trained."""
    recipe = ckpt["config"]["pretrain"]
    init = initial_state(ckpt["arch"], ckpt["width"], recipe["seed"], float(recipe.get("init_scale", 1.0)))
    backbone = dict(ckpt["backbone"])
    moved = [k for k in backbone if stage_of(k) == stage]
    if not moved:
        stages = sorted({stage_of(k) for k in backbone})
        raise ValueError(f"no stage {stage!r} in the checkpoint (stages: {stages})")
    for k in moved:
        if backbone[k].is_floating_point():
            backbone[k] = init[k] + alpha * (backbone[k] - init[k])
    return {**{k: v for k, v in ckpt.items() if k != "signals"}, "backbone": backbone}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", type=Path, help="a pretrain checkpoint (it records its seed and init scale)")
    ap.add_argument("--stage", default="layer3",
                    help="the stage to move (default layer3: ResNet20's deepest)")
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.0],
                    help="fractions of the way from init to trained (default 0: the stage at its init)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the copies, NAME-STAGE-aALPHA.ckpt")
    args = ap.parse_args(argv)
    ckpt = load_checkpoint(args.ckpt)
    args.out.mkdir(parents=True, exist_ok=True)
    for alpha in args.alpha:
        path = args.out / f"{args.ckpt.stem}-{args.stage}-a{alpha:g}.ckpt"
        torch.save(reset_stage(ckpt, args.stage, alpha), path)
        print(path)


if __name__ == "__main__":
    main()
