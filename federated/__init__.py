"""Federated simulation with FedAvg-family algorithms (Chen et al., ICLR 2023, §4.2-4.4)."""
