"""Pre-training backbones on synthetic fractals (Chen et al., ICLR 2023, §4.2, §4.5, Appendix A.2)."""

import fpsfl.base  # noqa: F401,E402 (sets the OpenMP wait before torch loads: see fpsfl.base)
