"""fpsfl demo: the paper's story in miniature on the embedded digits data (Chen et al., ICLR 2023).

1. pre-train ResNet20 with FPS at 32 px (§3, §4.2) on a small budget, with pretrain's default ``--recipe
   short`` (MoCo-v2 from an init scaled x0.1: the official SimSiam recipe does not move the backbone at
   this budget, issue 38);
2. FedAvg from random init, from that checkpoint and (when it ships) from the shipped FPS weights, three
   seeds each: Dir(alpha = 0.3) over 10 clients, full participation, the same rounds; plus the centralised
   baseline of the random and demo inits (§4.2, Table 2);
3. track optimal convex aggregation and the loss variance over lambda in the seed-0 runs, then ``analyze
   dynamics``, ``convex``, ``variance`` and ``report`` (§6);
4. write ``OUT/report.md`` with the table (mean ± std over seeds), the figures and how long each step took.

The federated setting was chosen with random init only (as the paper picks its learning rate with FedAvg
from random init): the digits preset (lr 0.02, batch 8) under Dir(0.3), where Dir(0.1) and 10 rounds left
it near chance, with the learning rate x0.1 after round 6 of 10 (the paper's step schedule, x0.1 every 30
of 100 rounds, in miniature). At a constant lr the last rounds swing by 10-15 points and the table moved
with the seed and the thread count; with the decay random init's seeds end within about 3 points, at 1 and
at 2 threads (docs/performance.md, "The demo"). Nothing is tuned to make FPS win.

Every step is a console command, run as a subprocess, two at a time with one thread each (two
processes of one thread each train ResNet20 on two cores 1.4x faster than one process of two threads);
its output is kept, so running the demo again with the same ``--out`` skips finished steps and resumes an
interrupted one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from analysis.runs import AnalysisError
from federated.initialisation import shipped_ready
from fpsfl.base.cli import COUNT, TEXT, Parser, UsageError, run_main, writable_dir
from fpsfl.base.rundir import RunDir

from .ledger import Ledger

SHIPPED_NAME = "fps-mocov2-t05-resnet20-cpu-1m"  # the shipped weights of the default recipe (issue 38)


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
    seeds: tuple[int, ...] = (0, 1, 2)
    width: float = 1.0  # ResNet20 width multiplier
    batch_size: int | None = None  # local batch; None: the digits preset (8)
    lr_decay_every: int | None = None  # rounds between x0.1 decays; None: federate's (30, Appendix B.1)
    jobs: int = 2  # steps run at once (each on one thread when more than one)
    note: str = ""


BUDGETS = {
    # a few seconds a step: for tests, checks that everything runs
    "smoke": Budget(1, 64, 32, 2, 1, 1, 10, 1, seeds=(0, 1), width=0.25, batch_size=64,
                    note="a smoke test of the pipeline only"),
    # fits 10 minutes on a 2-core CPU: 10 rounds, the loss variance over 50 lambdas (not the paper's 300)
    "default": Budget(2, 4096, 128, 10, 1, 10, 50, 2, lr_decay_every=6,
                      note="about 1/12,000 of the paper's pre-training (100 epochs x 1M pairs), 1/50 of "
                           "its federated budget (100 rounds x 5 local epochs) and 1/6 of its λ samples for "
                           "the loss variance (50, not 300)"),
    # the paper's budget (§4.2, Appendix A.2): for a GPU
    "full": Budget(100, 1_000_000, 256, 100, 5, 10, 300, 20, jobs=1, note="the paper's budget"),
}


@dataclass
class Step:
    name: str
    module: str  # the console script's module, run as ``python -m module argv``
    argv: list[str]
    done: Path  # federate: its final.pt, which exists once the run finished; pretrain: its run directory
    resume_if: Path | None = None  # exists when an interrupted run can be resumed
    after: tuple[str, ...] = ()  # names of the steps that must finish first
    seconds: float | None = None  # wall time; None: skipped (already done)
    cpu_seconds: float | None = None  # the subprocess's user + system CPU time (steadier than wall on a
    #                                   machine shared with other work)
    extra: dict = field(default_factory=dict)
    epochs: int | None = None  # pretrain: finished once its run directory's state counts these epochs

    def finished(self) -> bool:
        return federate_done(self.done) if self.epochs is None else pretrain_done(self.done, self.epochs)


def pretrain_done(run_dir: Path, epochs: int) -> bool:
    """A pre-training run is finished once its state counts every epoch: pretrain writes --out after every
    epoch, so the checkpoint's existence says nothing, and the state is the last file an epoch writes."""
    return RunDir(run_dir).done() >= epochs


def federate_done(final: Path) -> bool:
    """A federated run is finished once its final.pt exists (written after the last round's state)."""
    return final.exists()


def _federate_argv(out: Path, init: str, budget: Budget, device: str, seed: int, centralised: bool,
                   track: bool) -> list[str]:
    argv = ["--dataset", "digits", "--partition", "dirichlet", "--alpha", "0.3", "--clients", "10",
            "--participation", "1.0", "--rounds", str(budget.rounds),
            "--local-epochs", str(budget.local_epochs),
            "--algo", "fedavg", "--init", init, "--width", f"{budget.width:g}", "--seed", str(seed),
            "--device", device, "--out", str(out), "--quiet"]
    if budget.batch_size is not None:
        argv += ["--batch-size", str(budget.batch_size)]
    if budget.lr_decay_every is not None:
        argv += ["--lr-decay-every", str(budget.lr_decay_every)]
    if centralised:
        return argv + ["--centralized"]
    if not track:  # the local accuracies feed the dynamics of the tracked (seed-0) runs only
        return argv + ["--no-eval-local"]
    return argv + ["--track", "convex,variance", "--track-every", str(budget.track_every),
                   "--variance-samples", str(budget.variance_samples),
                   "--convex-epochs", str(budget.convex_epochs)]


def plan(out: Path, budget: Budget, device: str) -> list[Step]:
    ckpt = out / "fps.ckpt"
    pre = Step("pre-train ResNet20 with FPS + MoCo-v2 (--recipe short)", "pretrain.cli",
               ["fps", "--arch", "resnet20", "--width", f"{budget.width:g}", "--size", "32",
                "--epochs", str(budget.pretrain_epochs), "--pairs-per-epoch", str(budget.pretrain_pairs),
                "--batch-size", str(budget.pretrain_batch), "--device", device, "--out", str(ckpt),
                "--probe", "digits", "--quiet"], out / "fps.run", out / "fps.run" / "config.json",
               epochs=budget.pretrain_epochs)
    steps = [pre]
    inits = [("random", "random", ()), ("fps", str(ckpt), (pre.name,))]
    if shipped_ready(SHIPPED_NAME) and budget.width == 1.0:
        inits.append(("fps-shipped", SHIPPED_NAME, ()))
    for label, init, after in inits:
        for seed in budget.seeds:
            run = out / "runs" / f"fl-{label}-s{seed}"
            tracked = seed == budget.seeds[0] and label != "fps-shipped"
            steps.append(Step(f"FedAvg from {label} init, seed {seed}", "federated.cli",
                              _federate_argv(run, init, budget, device, seed, False, tracked),
                              run / "final.pt", run / "config.json", after,
                              extra={"run": run, "label": label, "seed": seed, "tracked": tracked}))
        if label != "fps-shipped":
            run = out / "runs" / f"cl-{label}"
            steps.append(Step(f"centralised baseline from {label} init", "federated.cli",
                              _federate_argv(run, init, budget, device, budget.seeds[0], True, False),
                              run / "final.pt", run / "config.json", after,
                              extra={"run": run, "label": label, "centralised": True}))
    return steps


def _command(step: Step) -> list[str]:
    """The step's command; with --resume once its run directory holds a config.json (the run started: it
    resumes from its last state, or starts again if it saved none)."""
    resume = ["--resume"] if step.resume_if is not None and step.resume_if.exists() else []
    return [sys.executable, "-m", step.module, *step.argv, *resume]


def run_steps(steps: list[Step], jobs: int, log: Path, ledger: Ledger) -> None:
    """Run the steps not done yet, ``jobs`` at a time once their ``after`` steps finished; each subprocess
    gets one thread when several run at once. Its output goes to ``log``; a failure stops the demo. A step
    is done only when ``ledger`` records the same settings and init for it (issue 42)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if jobs > 1 else {})}
    done = {s.name: s.finished() for s in steps}
    for s in steps:  # every step checked before any runs
        ledger.check(s.name, s.argv, done[s.name], s.extra.get("run", s.done))
    finished = {name for name, yes in done.items() if yes}
    todo = [s for s in steps if s.name not in finished]
    for s in steps:
        if s.name in finished:
            print(f"{s.name}: already done ({s.done}), skipped", flush=True)
    running: dict[str, tuple[Step, subprocess.Popen, float]] = {}
    bar = tqdm(total=len(todo), desc="demo steps", unit="step", dynamic_ncols=True)
    with log.open("a") as out:
        while todo or running:
            ready = [s for s in todo if set(s.after) <= finished]
            while ready and len(running) < jobs:
                step = ready.pop(0)
                todo.remove(step)
                tqdm.write(f"start: {step.name}")
                ledger.start(step.name, step.argv)
                out.write(f"$ {' '.join(_command(step))}\n")
                out.flush()
                running[step.name] = (step, subprocess.Popen(_command(step), stdout=out, stderr=out, env=env),
                                      time.perf_counter())
            time.sleep(0.2)
            for name, (step, proc, t0) in list(running.items()):
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # reaps it with its CPU time
                if pid == 0:
                    continue
                proc.returncode = os.waitstatus_to_exitcode(status)
                del running[name]
                step.seconds = time.perf_counter() - t0
                step.cpu_seconds = usage.ru_utime + usage.ru_stime
                if proc.returncode != 0:
                    for _, other, _ in running.values():
                        other.terminate()
                    raise AnalysisError(f"step '{name}' failed (exit {proc.returncode}); see {log}, fix it "
                                        f"and run the demo again with the same --out to continue")
                finished.add(name)
                bar.update(1)
                tqdm.write(f"done: {name} ({step.seconds:.0f} s, {step.cpu_seconds:.0f} CPU-s)")
    bar.close()


def cmd_demo(args: argparse.Namespace) -> None:
    from .report import write_report

    budget = BUDGETS[args.budget]
    out = writable_dir(Path(args.out))
    steps = plan(out, budget, args.device)
    jobs = args.jobs or budget.jobs
    print(f"fpsfl demo, {args.budget} budget ({budget.note}): {len(steps)} steps, {jobs} at a time, then the "
          f"analyses and {out / 'report.md'}", flush=True)
    t0 = time.perf_counter()
    run_steps(steps, jobs, out / "demo.log", Ledger(out, args.budget))
    table = write_report(out, steps, budget, args.budget, t0)
    print(table)
    print(f"report: {out / 'report.md'}")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="fpsfl", description="fpsfl: fractal pre-training for federated learning "
               "(Chen et al., ICLR 2023)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    d = sub.add_parser("demo", help="the paper's story in miniature on digits (no download, no GPU needed)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--out", type=TEXT, default="runs/demo",
                   help="output folder (default runs/demo); re-running with the same folder skips finished "
                        "steps")
    d.add_argument("--budget", choices=tuple(BUDGETS), default="default",
                   help="smoke: seconds, a pipeline check; default: under 10 minutes on a 2-core CPU; "
                   "full: the paper's budget (100 pre-training epochs x 1M pairs, 100 rounds x 5 local "
                   "epochs), for a GPU")
    d.add_argument("--device", type=TEXT, default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    d.add_argument("--jobs", type=COUNT, help="steps run at once, one thread each when more than one "
                   "(default: 2 on the smoke and default budgets, 1 on full)")
    d.set_defaults(run=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main("fpsfl", build_parser(), argv, (AnalysisError, UsageError, ValueError), ())


if __name__ == "__main__":
    sys.exit(main())
