"""``pretrain --compile`` (issue 40): the compiled step computes the eager step.

Each test trains the same run twice from one seed, eager and compiled in one process, 2 epochs of 3 steps,
and compares every epoch's loss and ``z_std`` and every weight of the method (backbone and heads; MoCo's
key encoder and memory bank too) at the end.

Tolerances, and why:

- default suite, ``aot_eager`` backend (``FPSFL_TEST_COMPILE_BACKEND``): the step traced and split into
  forward and backward graphs by Dynamo and AOTAutograd, as inductor gets it, but run by the eager
  kernels. Same kernels, same order: the tolerance is 1e-6 relative (losses) and 1e-6 relative L2 per
  tensor (weights): above float32's 6e-8 rounding, and far below the change a wrong graph makes (a
  BatchNorm statistic not updated, a gradient missed). Measured on the 2-vCPU VM (torch 2.14.1):
  bit-identical. About 5 s a method; the default-suite tests of this file take about 23 s on 2 cores.
- ``-m slow``, inductor (the real ``--compile``): fused C++ kernels sum in another order, so float32 runs
  differ by rounding, and SimSiam amplifies rounding at initialisation (see ``pretrain/train.py``: float32
  runs with 1 and 2 threads drift apart by per cents): measured in float32 after 6 steps, losses 1.5e-5
  apart and a BatchNorm bias 0.3% (SimSiam) / 1.3% (MoCo-v2) apart. So the inductor test trains in
  float64 (``FPSFL_TEST_FLOAT64``), where that amplification stays far below the tolerance of 1e-9
  relative (measured: losses equal, weights 8e-13 / 4e-14 apart; ``z_std``, computed in float32 by
  design, keeps the 1e-6 tolerance and differed by 8e-8). Compiling a ResNet20 (width 0.25) with
  inductor takes 35-70 s on 2 cores with an empty cache (the two tests: 90 s), hence ``slow``.
"""

from __future__ import annotations

import json

import pytest
import torch

from fpsfl.base.checkpoint import load_weights_only
from fpsfl.base.syncs import SyncCounter
from pretrain.cli import main
from pretrain.recipe import PretrainConfig, RunOptions
from pretrain.train import COMPILE_BACKEND_ENV, FLOAT64_ENV, build_method, compile_step, make_optimizer, train

HEADS = {"simsiam": {"proj_dim": 32, "pred_dim": 8}, "mocov2": {"hidden_dim": 32, "bank_size": 64}}
FAST_TOL, INDUCTOR_TOL = 1e-6, 1e-9


def _run(tmp_path, method: str, compiled: bool) -> tuple[list[dict], dict[str, torch.Tensor]]:
    cfg = PretrainConfig(source="fps", method=method, method_args=HEADS[method], arch="resnet20", width=0.25,
                         size=16, batch_size=8, pairs_per_epoch=24, epochs=2)
    name = "compiled" if compiled else "eager"
    opts = RunOptions(out=tmp_path / f"{name}.ckpt", run_dir=tmp_path / f"{name}.run", device="cpu",
                      workers=0, progress=False, compile=compiled)
    train(cfg, opts)
    rows = [json.loads(line) for line in (opts.run_dir / "metrics.jsonl").read_text().splitlines()]
    state = load_weights_only(opts.run_dir / "state.pt", "state", ValueError)
    return rows, {**state["model"], **{f"extra.{k}": v for k, v in state["extra"].items()}}


def _compare(tmp_path, monkeypatch, method: str, backend: str, tol: float) -> int:
    """Train eager, then compiled; assert they agree within ``tol``; return the graphs compiled."""
    monkeypatch.setenv(COMPILE_BACKEND_ENV, backend)
    torch._dynamo.reset()
    eager_rows, eager = _run(tmp_path, method, compiled=False)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled_rows, compiled = _run(tmp_path, method, compiled=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    assert [r["steps"] for r in eager_rows] == [r["steps"] for r in compiled_rows] == [3, 3]
    for a, b in zip(eager_rows, compiled_rows, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=tol, abs=1e-12)
        # z_std is computed in float32 whatever the weights' dtype (feature_std): float32's tolerance
        assert b["z_std"] == pytest.approx(a["z_std"], rel=FAST_TOL)
    assert eager.keys() == compiled.keys()
    for key, value in eager.items():
        if value.is_floating_point():
            diff = (compiled[key].double() - value.double()).norm().item()
            assert diff <= tol * value.double().norm().item() + 1e-12, (key, diff)
        else:
            assert torch.equal(value, compiled[key]), key  # step counts, the bank's pointer
    return graphs


@pytest.mark.parametrize("method", ["simsiam", "mocov2"])
def test_a_compiled_step_equals_the_eager_step(tmp_path, monkeypatch, one_thread, method):
    """aot_eager: Dynamo's graphs, eager kernels. Each method's step is one graph: MoCo-v2's bank update
    writes at the position in its buffer, so it is traced with the rest (while the position was a Python
    int it stayed eager and cut the step into 3 graphs). No graph is compiled again for the next steps or
    the next epoch's learning rate (a recompilation is an error here)."""
    with torch._dynamo.config.patch(error_on_recompile=True):
        graphs = _compare(tmp_path, monkeypatch, method, "aot_eager", FAST_TOL)
    assert graphs == 1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["simsiam", "mocov2"])
def test_an_inductor_compiled_step_equals_the_eager_step_in_float64(tmp_path, monkeypatch, one_thread,
                                                                    method):
    monkeypatch.setenv(FLOAT64_ENV, "1")
    _compare(tmp_path, monkeypatch, method, "inductor", INDUCTOR_TOL)


@pytest.mark.parametrize("method", ["simsiam", "mocov2"])
def test_a_compiled_step_reads_nothing_back(monkeypatch, method):
    """No host sync inside a compiled graph is possible (a read ends the graph, and runs eagerly, where the
    counter sees it): neither method's compiled step reads anything back, MoCo-v2's bank update included
    (it writes at the position in its buffer: docs/performance.md, CUDA graphs)."""
    import fpsfl.base.images as images
    from fractals.stream import augment_views
    monkeypatch.setattr(images, "SYNC_FREE", True)
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    cfg = PretrainConfig(method=method, width=0.25, size=16, batch_size=8, method_args=HEADS[method])
    method_ = build_method(cfg, None, torch.device("cpu")).train()
    optimizer, _ = make_optimizer(method_, cfg)
    model = compile_step(method_, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    pairs = torch.randint(0, 256, (2, 8, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator())

    def step():
        loss, _ = model(augment_views(pairs, method_.n_views, method_.augment, gen), None)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        method_.after_step()
    with SyncCounter():  # compiles (Dynamo's guards include the active mode); the device constants are made
        step()
    with SyncCounter() as counter:
        step()
    assert dict(counter.calls) == {}


def test_the_flag_is_in_the_cli_and_its_help(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    with pytest.raises(SystemExit):
        main(["fps", "--help"])
    assert "--compile" in capsys.readouterr().out
    out = tmp_path / "c.ckpt"
    code = main(["fps", "--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "1",
                 "--batch-size", "8", "--pairs-per-epoch", "16", "--device", "cpu", "--quiet", "--method",
                 "simsiam", "--set", "proj_dim=32", "--set", "pred_dim=8", "--compile", "--out", str(out)])
    assert code == 0 and out.is_file()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    saved = json.loads((tmp_path / "c.run" / "config.json").read_text())
    assert saved["run"]["compile"] == "True"


@pytest.mark.parametrize("backend,tol", [("aot_eager", 0.0),
                                         pytest.param("inductor", 1e-4, marks=pytest.mark.slow)])
def test_compiled_views_equal_the_eager_views_and_read_nothing_back(backend, tol):
    """The views ``--compile`` makes on an accelerator (``compiled_views``: the sync-free form as one graph,
    ``fullgraph`` so any graph break fails) equal the eager host form's from the same generator, batch
    after batch without recompiling. aot_eager runs the eager kernels: equal bit for bit. Inductor fuses
    and rounds otherwise (2 views of 256 at 32 px: at most 6e-6 apart, the views normalised to about +-2):
    a tolerance of 1e-4, far below what a wrong op does (a flip or a jitter order moves pixels by 0.1-2)."""
    from fpsfl.base.images import AugmentConfig
    from fractals.stream import augment_views
    from pretrain.compiled import compiled_views
    torch._dynamo.reset()
    pairs = torch.randint(0, 256, (2, 8, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator())
    cfg = AugmentConfig()
    eager_gen, gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    applier = compiled_views(backend)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in range(3):
            expected = augment_views(pairs, 2, cfg, eager_gen)  # on the CPU: the host form
            with SyncCounter() as counter:
                views = augment_views(pairs, 2, cfg, gen, applier=applier)
            if batch:  # the first call compiles (and makes the device constants)
                assert counter.total == 0, dict(counter.calls)
            assert views.shape == expected.shape == (2, 8, 3, 16, 16)
            assert (views - expected).abs().max().item() <= tol, batch
