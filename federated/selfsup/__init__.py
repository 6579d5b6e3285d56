"""Federated self-supervised pre-training on the clients' own unlabelled data (Chen et al., ICLR 2023, §5,
Table 7 and App. B.3: "self-pre-training", SP).

``federate self-pretrain --algo orchestra ... --out sp.ckpt`` runs a federated self-supervised method on the
clients' images (never their labels) and writes an ``fpsfl-backbone/1`` checkpoint that ``federate --init
sp.ckpt`` fine-tunes with the same clients' data. A method is one file of :mod:`.methods` registering a
:class:`.base.FederatedSSL` subclass in :data:`FED_SSL`; the round loop (:mod:`.rounds`, :mod:`.runner`)
knows only that interface. The clustering math of Orchestra is in :mod:`.clustering`, the augmented views
in :mod:`.views`.
"""

from __future__ import annotations

from fpsfl.base.registry import Registry

FED_SSL: Registry[type] = Registry("federated self-supervised method", discover="federated.selfsup.methods")

__all__ = ["FED_SSL"]
