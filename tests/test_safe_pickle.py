"""fpsfl.base.safepickle: numpy arrays and plain Python data come back as pickled, under every protocol and
in numpy 1.x's names; anything else is refused before it is called (issue 42: no file we read runs code)."""

import io
import os
import pickle

import numpy as np
import pytest

from fpsfl.base.safepickle import UnsafePickleError, load


class Payload:
    """What a hostile file holds: unpickling it calls ``os.system`` (pickling it runs nothing)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


PLAIN = {"uint8": np.arange(12, dtype=np.uint8).reshape(3, 4), "float64": np.linspace(0, 1, 5),
         "fortran": np.asfortranarray(np.ones((2, 3), np.int16)), "empty": np.zeros((0, 3072), np.uint8),
         "structured": np.zeros(2, [("a", "<i4"), ("b", "<f8")]), "scalar": np.float64(1.5),
         "int scalar": np.int64(-3), "list": [1, 2.5, "x", b"y", b"", None, True, 1 + 2j],
         "nested": {b"data": (1, [2, {"k": "v"}])}}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_arrays_and_plain_data_load_as_pickled(protocol):
    for name, value in PLAIN.items():
        assert _same(value, load(io.BytesIO(pickle.dumps(value, protocol=protocol)))), name


def test_numpy_1_names_load_too():
    # numpy 1.x (and the published CIFAR / ImageNet32 files) name numpy.core, numpy 2 numpy._core
    raw = pickle.dumps({"data": PLAIN["uint8"], "mean": np.float32(2)}, protocol=2)
    old = load(io.BytesIO(raw.replace(b"numpy._core.", b"numpy.core.")))
    assert _same(old["data"], PLAIN["uint8"]) and _same(old["mean"], np.float32(2))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_payload_is_refused_in_one_line_and_never_runs(protocol, tmp_path):
    marker = tmp_path / "ran"
    raw = pickle.dumps({"data": np.zeros(3, np.uint8), "labels": [Payload(marker)]}, protocol=protocol)
    with pytest.raises(UnsafePickleError, match=r"it holds (posix|os|nt)\.system.*refusing") as e:
        load(io.BytesIO(raw))
    assert "\n" not in str(e.value) and not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # the pickle module's own error class: callers catch it
        load(io.BytesIO(raw))
    pickle.loads(raw)  # the plain unpickler runs it: the test's payload is real
    assert marker.exists()


def test_other_globals_and_codecs_are_refused():
    for module, name in (("builtins", "eval"), ("numpy", "load"), ("subprocess", "Popen"),
                         ("builtins", "set")):
        with pytest.raises(UnsafePickleError, match=f"{module}.{name}"):
            load(io.BytesIO(f"c{module}\n{name}\n.".encode()))  # GLOBAL opcode, then STOP
    rot13 = b"c_codecs\nencode\n(Vabc\nVrot13\ntR."  # encode("abc", "rot13"): only latin1 rebuilds bytes
    with pytest.raises(UnsafePickleError, match="rot13"):
        load(io.BytesIO(rot13))
