"""``fpsfl demo``: the top of the one-way house, the only package that drives pretrain, federate and analyze
together (:mod:`fpsfl.demo.cli`, with its report in :mod:`fpsfl.demo.report`)."""

import fpsfl.base  # noqa: F401,E402 (sets the OpenMP wait before torch loads: see fpsfl.base)
