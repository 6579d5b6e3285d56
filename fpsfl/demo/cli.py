"""fpsfl demo: the paper's story in miniature on the embedded digits data (Chen et al., ICLR 2023).

1. pre-train ResNet20 with FPS + SimSiam at 32 px (§3, §4.2) on a small budget;
2. FedAvg from random init and from that checkpoint: Dir(alpha = 0.1), 10 clients, full participation,
   same seed and rounds, plus the centralised baseline of each init (§4.2, Table 2);
3. track optimal convex aggregation and the loss variance over lambda in both federated runs, then
   ``analyze dynamics``, ``convex``, ``variance`` and ``report`` (§6);
4. write ``OUT/report.md`` with the table, the figures and how long each step took.

Every step is a console command run in-process, and its output is kept: running the demo again with the
same ``--out`` skips finished steps and resumes an interrupted one. The numbers are whatever they come
out as; nothing is tuned to make one init win.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from analysis.runs import AnalysisError
from federated.initialisation import SHIPPED
from fpsfl.base.cli import Parser, UsageError, run_main


@dataclass(frozen=True)
class Budget:
    pretrain_epochs: int
    pretrain_pairs: int  # pairs per epoch
    pretrain_batch: int
    rounds: int
    local_epochs: int
    track_every: int  # rounds
    variance_samples: int
    convex_epochs: int
    width: float = 1.0  # ResNet20 width multiplier
    batch_size: int | None = None  # local batch; None: the digits preset (8)
    note: str = ""


BUDGETS = {
    # a few seconds a step: for tests, checks that everything runs
    "smoke": Budget(1, 64, 32, 2, 1, 1, 10, 1, width=0.25, batch_size=64,
                    note="a smoke test of the pipeline only"),
    # fits 10 minutes on a 2-core CPU
    # (the loss variance over 50 lambdas instead of the paper's 300: its 100 test-set evaluations per
    # tracked round were a fifth of the demo's time)
    "default": Budget(2, 4096, 128, 10, 1, 5, 50, 2,
                      note="about 1/12,000 of the paper's pre-training (100 epochs x 1M pairs), 1/50 of "
                           "its federated budget (100 rounds x 5 local epochs) and 1/6 of its λ samples for "
                           "the loss variance (50, not 300)"),
    # the paper's budget (§4.2, Appendix A.2): for a GPU
    "full": Budget(100, 1_000_000, 256, 100, 5, 10, 300, 20, note="the paper's budget"),
}


@dataclass
class Step:
    name: str
    main: Callable[[list[str]], int]
    argv: list[str]
    done: Path  # exists once the step has finished
    resume_if: Path | None = None  # exists when an interrupted run can be resumed
    seconds: float | None = None  # None: skipped (already done)
    extra: dict = field(default_factory=dict)


def _federate_argv(out: Path, init: str, budget: Budget, device: str, centralised: bool) -> list[str]:
    argv = ["--dataset", "digits", "--partition", "dirichlet", "--alpha", "0.1", "--clients", "10",
            "--participation", "1.0", "--rounds", str(budget.rounds),
            "--local-epochs", str(budget.local_epochs),
            "--algo", "fedavg", "--init", init, "--width", f"{budget.width:g}", "--seed", "0",
            "--device", device, "--out", str(out)]
    if budget.batch_size is not None:
        argv += ["--batch-size", str(budget.batch_size)]
    if centralised:
        return argv + ["--centralized"]
    return argv + ["--track", "convex,variance", "--track-every", str(budget.track_every),
                   "--variance-samples", str(budget.variance_samples),
                   "--convex-epochs", str(budget.convex_epochs)]


def plan(out: Path, budget: Budget, device: str) -> list[Step]:
    from federated.cli import main as federate
    from pretrain.cli import main as pretrain

    ckpt = out / "fps.ckpt"
    steps = [Step("pre-train ResNet20 with FPS + SimSiam", pretrain,
                  ["fps", "--arch", "resnet20", "--width", f"{budget.width:g}", "--size", "32",
                   "--epochs", str(budget.pretrain_epochs), "--pairs-per-epoch", str(budget.pretrain_pairs),
                   "--batch-size", str(budget.pretrain_batch), "--device", device, "--out", str(ckpt)],
                  ckpt, out / "fps.run" / "state.pt")]
    inits = [("random", "random"), ("fps", str(ckpt))]
    if SHIPPED["fps-resnet20"].is_file() and budget.width == 1.0:  # the paper recipe, when it ships
        inits.append(("fps-paper", "fps-resnet20"))
    for label, init in inits:
        for cl in (False, True):
            run = out / "runs" / f"{'cl' if cl else 'fl'}-{label}"
            what = "centralised baseline" if cl else "FedAvg"
            steps.append(Step(f"{what} from {label} init", federate,
                              _federate_argv(run, init, budget, device, cl), run / "final.pt",
                              run / "state.pt", extra={"run": run, "centralised": cl, "label": label}))
    return steps


def run_steps(steps: list[Step]) -> None:
    for i, step in enumerate(steps, 1):
        header = f"[{i}/{len(steps)}] {step.name}"
        if step.done.exists():
            print(f"{header}: already done ({step.done}), skipped", flush=True)
            continue
        print(header, flush=True)
        argv = step.argv + (["--resume"] if step.resume_if is not None and step.resume_if.exists() else [])
        t0 = time.perf_counter()
        code = step.main(argv)
        step.seconds = time.perf_counter() - t0
        if code != 0:
            raise AnalysisError(f"step '{step.name}' failed (exit {code}); fix what it printed above and run "
                                f"the demo again with the same --out to continue")


def cmd_demo(args: argparse.Namespace) -> None:
    from .report import write_report

    budget = BUDGETS[args.budget]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = plan(out, budget, args.device)
    print(f"fpsfl demo, {args.budget} budget ({budget.note}): {len(steps)} steps, then the analyses and "
          f"{out / 'report.md'}", flush=True)
    t0 = time.perf_counter()
    run_steps(steps)
    table = write_report(out, steps, budget, args.budget, t0)
    print(table)
    print(f"report: {out / 'report.md'}")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="fpsfl", description="fpsfl: fractal pre-training for federated learning "
               "(Chen et al., ICLR 2023)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    d = sub.add_parser("demo", help="the paper's story in miniature on digits (no download, no GPU needed)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--out", default="runs/demo", help="output folder (default runs/demo); re-running with "
                   "the same folder skips finished steps")
    d.add_argument("--budget", choices=tuple(BUDGETS), default="default",
                   help="smoke: seconds, a pipeline check; default: under 10 minutes on a 2-core CPU; "
                   "full: the paper's budget (100 pre-training epochs x 1M pairs, 100 rounds x 5 local "
                   "epochs), for a GPU")
    d.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    d.set_defaults(run=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main("fpsfl", build_parser(), argv, (AnalysisError, UsageError, ValueError), ())


if __name__ == "__main__":
    sys.exit(main())
