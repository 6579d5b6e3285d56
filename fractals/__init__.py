"""fractals: the synthetic-data engine of fpsfl.

IFS code sampling (Anderson & Farrell 2022, :mod:`fractals.ifs`) and a numba renderer that makes Fractal Pair
Similarity (FPS) pairs on the fly (Chen et al., ICLR 2023, §4.2, Appendix A.1: :mod:`fractals.render`,
:mod:`fractals.compose`, :mod:`fractals.scenes`, :mod:`fractals.stream`), plus the multi-label and
single-fractal baselines. Importing the package loads nothing: numba is paid for only by the modules that
render.
"""

import fpsfl.base  # noqa: F401,E402 (sets the OpenMP wait before torch loads: see fpsfl.base)
