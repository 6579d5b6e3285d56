"""``fpsfl demo``: the top of the one-way house, the only package that drives pretrain, federate and analyze
together (:mod:`fpsfl.demo.cli`, with its report in :mod:`fpsfl.demo.report`)."""
