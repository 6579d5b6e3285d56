"""``federate --compile`` (issue 40): the one-client step's forward and backward compiled
(:func:`federated.local.compile_model`) equal the eager ones, are traced once a run rather than once a round,
and read nothing back. The ``aot_eager`` backend (``FPSFL_TEST_COMPILE_BACKEND``) traces and splits the step
as inductor does and runs eager kernels, so a compiled run is bit-identical to the eager run; inductor's
fused float32 kernels round differently (docs/performance.md, Compiled steps)."""

from __future__ import annotations

import functools

import pytest
import torch

from federated.algorithms import ALGORITHMS
from fpsfl.base.device import COMPILE_BACKEND_ENV
from fpsfl.base.syncs import SyncCounter
from tests.federated.test_algorithms import _cfg, _final, _run
from tests.fpsfl.test_syncs import one_client

# the algorithms whose client hooks touch the forward differently: none (FedAvg), a proximal term
# (FedProx), a gradient correction (SCAFFOLD), a second output and frozen models (MOON); the rest: -m slow
FAST = {"fedavg", "fedprox", "scaffold", "moon"}


@pytest.fixture
def aot_eager(monkeypatch):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rows(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.mark.parametrize("algo", [a if a in FAST else pytest.param(a, marks=pytest.mark.slow)
                                  for a in sorted(ALGORITHMS)])
def test_a_compiled_run_equals_the_eager_run(tmp_path, aot_eager, algo):
    """Every round's metrics and the final model bit-identical, clients one at a time (the CPU's
    --client-batch), with short last batches of several sizes (recompiled with a dynamic batch)."""
    cfg = _cfg(algo, alpha=0.5)
    eager = _run(tmp_path, cfg, "eager")
    compiled = _run(tmp_path, cfg, "compiled", compile=True)
    assert _rows(compiled) == _rows(eager)
    a, b = _final(tmp_path, "eager"), _final(tmp_path, "compiled")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _local(compiled: bool, batch: int, steps: int, size: int | None = None) -> dict:
    """``steps`` local steps of FedAvg at ``batch`` samples, from the same model, eager or compiled, on
    ``size`` px inputs: the final state."""
    train, batches, model = one_client("fedavg", 1, batch, compiled, size)
    train(batches[:steps])
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_one_sample_steps_run_eagerly_and_equal_the_eager_steps(aot_eager):
    """A client's one-sample batches: BatchNorm layers that see one value switch to their running
    statistics through hooks added for the step (``one_value_batchnorm``); with --compile those rare steps
    run eagerly. At 4 px ResNet20's last stage sees 1x1 maps, where the hooks switch."""
    eager, compiled = _local(False, 1, 6, 4), _local(True, 1, 6, 4)
    assert all(torch.equal(eager[k], compiled[k]) for k in eager)


@pytest.fixture
def traced(monkeypatch) -> list[int]:
    """--compile's backend replaced by one that records each graph it is given (its node count) and runs it
    eagerly: the list fills as Dynamo traces."""
    import torch._dynamo

    _GRAPHS.clear()
    monkeypatch.setenv(COMPILE_BACKEND_ENV, _counting_backend())
    torch._dynamo.reset()
    yield _GRAPHS
    torch._dynamo.reset()


_GRAPHS: list[int] = []


@functools.cache
def _counting_backend() -> str:
    """The recording backend's name, registered once a process (Dynamo refuses a name twice)."""
    import torch._dynamo

    def counting(gm, inputs):
        _GRAPHS.append(len(gm.graph.nodes))
        return gm.forward
    torch._dynamo.register_backend(counting, name="fpsfl_test_counting")
    return "fpsfl_test_counting"


def test_the_step_is_traced_once_a_run_not_once_a_round(tmp_path, traced):
    """Three rounds of three clients trace as many graphs as one round: each round's fresh copy of the
    model (:func:`federated.rounds.local_model`) reuses the graphs of the first."""
    _run(tmp_path, _cfg("fedavg", rounds=1, alpha=0.5), "one", compile=True)
    after_one = len(traced)
    torch._dynamo.reset()
    traced.clear()
    _run(tmp_path, _cfg("fedavg", rounds=3, alpha=0.5), "three", compile=True)
    assert 1 <= after_one <= 3, after_one  # a full batch, then a dynamic batch for the short ones
    assert len(traced) == after_one, (after_one, len(traced))


@pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="set_stance: torch >= 2.6")
def test_one_sample_steps_trace_nothing(traced):
    """The rare one-sample steps run eagerly under --compile (``one_value_batchnorm``'s force_eager
    stance): no graph is traced for them and their hooks, whereas two-sample steps trace one."""
    train, batches, _ = one_client("fedavg", 1, 1, compiled=True, size=4)
    train(batches[:3])
    assert traced == []
    train, batches, _ = one_client("fedavg", 1, 2, compiled=True, size=4)
    train(batches[:1])
    assert len(traced) >= 1


def test_a_compiled_local_step_reads_nothing_back(aot_eager):
    train, batches, _ = one_client("fedavg", 2, 16, compiled=True)
    batches = [b for b in batches if len(b) == 16]
    with SyncCounter():  # compiles (Dynamo's guards include the active mode)
        train(batches[:1])
    with SyncCounter() as counter:
        train(batches)
    assert len(batches) >= 8
    assert dict(counter.calls) == {"item": 1}  # the summed loss, read once after the last step


def test_the_flag_is_in_the_cli_help(capsys):
    from federated.cli import main
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--compile" in capsys.readouterr().out
