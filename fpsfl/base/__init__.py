"""The shared base of fractals, pretrain, federated and analysis: it imports none of them, nor numba or
lightly, so every console script starts without loading the renderer or the SSL library it does not use.

Importing it also sets how torch's OpenMP threads wait, before torch loads (every package's ``__init__``
imports this first). libgomp's threads spin-wait for the next parallel region: alone that saves a little,
but with a second PyTorch process on the machine the spinning threads steal each other's cores. Measured
on the 2-vCPU development VM, two ``federate`` runs of 2 rounds at once took 73 s each by default, 38 s with
``OMP_WAIT_POLICY=PASSIVE`` and 43 s with ``GOMP_SPINCOUNT=1000``; alone they took 18.6 s, 25.8 s and
17.2 s. A short spin keeps the speed alone and most of the gain when shared, so it is the default here;
a user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` always wins.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
