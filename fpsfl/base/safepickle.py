"""Unpickling a file a user gave us without running code: numpy arrays and plain Python data only.

A pickle names the callables that rebuild its objects and the unpickler calls them, so ``pickle.load`` on a
file whose ``__reduce__`` names ``os.system`` runs a shell command. The published datasets we read as
pickles (CIFAR's python batches, Chrabaszcz et al. 2017's down-sampled ImageNet) hold only dicts, lists,
numbers, strings, bytes and numpy arrays, so :class:`SafeUnpickler` resolves only the names numpy's own
array and scalar pickles use (numpy 1.x spells them ``numpy.core``, 2.x ``numpy._core``) and the few that
Python's protocols 0-2 use for bytes and complex numbers; any other name is refused with
:class:`UnsafePickleError` before anything is called. This is the "Restricting Globals" recipe of the Python
documentation (``pickle`` module, §"Restricting Globals"); checkpoints get the same guarantee from
``torch.load(weights_only=True)`` in :mod:`fpsfl.base.checkpoint`.
"""

from __future__ import annotations

import pickle
from typing import Any, BinaryIO

import numpy as np

try:  # numpy >= 1.26 (and 2.x, where numpy.core only warns and forwards here)
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # numpy < 1.26
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that names a global outside the allowed few; the message is one line."""


def _bytes_from_latin1(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocols 0-2 use it for bytes (``encode(str, "latin1")``), and only that."""
    if encoding.lower().replace("_", "-") not in ("latin1", "latin-1", "iso-8859-1"):
        raise UnsafePickleError(f"refusing _codecs.encode with encoding {encoding!r} (only latin1 rebuilds "
                                f"bytes)")
    return text.encode("latin1")


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _bytes_from_latin1,
}
for _module in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_module}.multiarray", "_reconstruct")] = _multiarray._reconstruct  # ndarray, protocols 0-4
    _ALLOWED[(f"{_module}.multiarray", "scalar")] = _multiarray.scalar  # np.float64(...) and friends
    _ALLOWED[(f"{_module}.numeric", "_frombuffer")] = _numeric._frombuffer  # ndarray, protocol 5
for _module in ("builtins", "__builtin__"):  # Python 3 and Python 2 spellings
    _ALLOWED[(_module, "bytes")] = bytes  # b"" under protocols 0-2
    _ALLOWED[(_module, "complex")] = complex


class SafeUnpickler(pickle.Unpickler):
    """:class:`pickle.Unpickler` that resolves only numpy's array names and plain builtins (see module)."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise UnsafePickleError(f"it holds {module}.{name}, which is not a numpy array or plain Python "
                                    f"data; refusing to unpickle it")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("it refers to a persistent id; refusing to unpickle it")


def load(f: BinaryIO, encoding: str = "latin1") -> Any:
    """Unpickle one object from the open binary file ``f`` with :class:`SafeUnpickler`. ``encoding``
    latin1 (the default) reads Python 2 pickles too: their ``str`` become ``str`` with the bytes kept as is,
    which numpy's arrays expect."""
    return SafeUnpickler(f, encoding=encoding).load()
