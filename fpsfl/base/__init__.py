"""The shared base of fractals, pretrain, federated and analysis: it imports none of them, nor numba or
lightly, so every console script starts without loading the renderer or the SSL library it does not use."""
