"""analyze: explain a federated run (Chen et al., ICLR 2023, §6; Appendix B.2, C.2, C.5).

  analyze dynamics RUN [RUN...]          local/global gain per round (Eq. 3, Fig. 6)
  analyze convex RUN [RUN...]            FedAvg vs optimal convex aggregation (Eq. 4, Fig. 7)
  analyze variance RUN [RUN...]          test loss over lambda ~ Dirichlet(1) (Figs. 8, 13, 18)
  analyze landscape RUN_A RUN_B RUN_C [RUN...]   2-D training-loss landscape (Fig. 9)
  analyze report RUN [RUN...]            Federated / Centralised / ΔCL-FL tables (Tables 2-5)
  analyze probe CKPT [CKPT...]           kNN and linear probe of checkpoints, beside a random init
  analyze budget CKPT... --runs RUN...   probe and FedAvg accuracy against FPS pairs seen
  analyze tensorboard RUN... --out DIR   runs' metrics lines as TensorBoard events

Analyses only read run directories (made by federate). convex and variance are ORACLE analyses on the test
set, as in the paper. Combined models average BatchNorm statistics with the same weights as the
parameters, as FedAvg does (--bn-recompute re-estimates them on training data instead). Figures are PNG
with a JSON of the plotted numbers beside each, in --out (default RUN/figures for one run, else analysis/ in
the common parent of the runs or checkpoints: beside the inputs, never in the working directory).
"""

from __future__ import annotations

import argparse
import sys

from fpsfl.base.cli import Parser, run_main

from . import budget, dynamics, landscape, probe, report, tensorboard, tracked
from .runs import AnalysisError

# each registers its subcommands
COMMANDS = (dynamics, tracked, landscape, report, probe, budget, tensorboard)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="analyze", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main("analyze", build_parser(), argv, (AnalysisError, ValueError), ())


if __name__ == "__main__":
    sys.exit(main())
