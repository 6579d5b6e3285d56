"""Pre-training backbones on synthetic fractals (Chen et al., ICLR 2023, §4.2, §4.5, Appendix A.2)."""
