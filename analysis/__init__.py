"""Analyses of federated runs that explain why pre-training helps (Chen et al., ICLR 2023, §6)."""
