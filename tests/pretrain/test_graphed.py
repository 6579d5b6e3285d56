"""``pretrain --cuda-graph`` (issue 40): the captured step trains as the eager step.

On the CPU the capture is a stand-in that records the step and replays it by calling it (a real CUDA graph
needs a GPU), and that fails where a real graph would go silently wrong: every tensor the step reads or
writes (weights, gradients, buffers, the optimiser's state, the epoch's sums, the static batch) must keep
its storage from the capture on, because a graph replays fixed addresses. Same kernels in the same order
on the static buffers: the default-suite comparison is exact. The ``gpu`` test captures for real.
"""

from __future__ import annotations

import pytest
import torch

from fractals.stream import draw_views
from pretrain.graphed import (
    GraphedStep,
    PinnedCapture,
    Step,
    cuda_capture,
    cuda_side_stream,
    eager_capture,
    make_step,
    sgd_update,
)
from pretrain.recipe import PretrainConfig
from pretrain.train import build_method, make_optimizer, set_lr, warm_lr

HEADS = {"simsiam": {"proj_dim": 32, "pred_dim": 8}, "mocov2": {"hidden_dim": 32, "bank_size": 64}}
SIZES = (8, 8, 8, 8, 8, 4)  # an epoch: five full batches and a short last one, as pretrain's sources give


def _renders(device: torch.device, epochs: int = 2) -> list[list[torch.Tensor]]:
    """uint8 pairs (2, B, 16, 16, 3) of every step, as pretrain's sources give them."""
    gen = torch.Generator().manual_seed(1)
    return [[torch.randint(0, 256, (2, b, 16, 16, 3), dtype=torch.uint8, generator=gen).to(device)
             for b in SIZES] for _ in range(epochs)]


# MoCo-v2 settings that change its step ("mocov2+empty"): an empty bank's mask, the uniformity term,
# the symmetric loss's second direction
MOCO_VARIANTS = {"empty": {"bank_start": "empty"}, "uniformity": {"feature_uniformity": 0.5},
                 "symmetric": {"symmetric": True}, "background": {"background_p": 0.5},
                 "last_stage": {"last_stage_lr": 0.1}}  # a group of its own at its own rate


def _train(method_name: str, device: torch.device, make,
           warm: bool = False) -> tuple[list[float], dict, Step]:
    """Two epochs from seed 0 (``warm``: under a warm-up over both, a rate per step); returns the epochs'
    summed losses, the final state and the step."""
    method_name, _, variant = method_name.partition("+")
    args = {**HEADS[method_name], **MOCO_VARIANTS.get(variant, {})}
    cfg = PretrainConfig(method=method_name, width=0.25, size=16, batch_size=8, epochs=2, method_args=args)
    torch.manual_seed(0)
    method = build_method(cfg, None, device).train()
    optimizer, base_lr = make_optimizer(method, cfg)
    step = make(method, optimizer)
    losses, gen = [], torch.Generator(device=device).manual_seed(2)
    for epoch, batches in enumerate(_renders(device)):
        set_lr(optimizer, base_lr, epoch, cfg.epochs)
        epoch_lrs = [g["lr"] for g in optimizer.param_groups]
        step.begin_epoch()
        for i, images in enumerate(batches):
            if warm:
                warm_lr(optimizer, epoch_lrs, (epoch * len(batches) + i + 1) / (2 * len(batches)))
            step(images, draw_views(images, method.n_views, method.augment, gen), None)
        losses.append(float(step.loss_sum))
    state = {k: v.detach().cpu().clone() for k, v in method.state_dict().items()}
    state.update({f"extra.{k}": v.cpu() for k, v in method.extra_state().items()})
    return losses, state, step


def _eager(method, optimizer):
    return Step(method, method, optimizer)


def _pinned(method, optimizer):
    return GraphedStep(method, method, optimizer, capture=PinnedCapture())


@pytest.mark.parametrize("method", ["simsiam", "mocov2", *(f"mocov2+{v}" for v in MOCO_VARIANTS)])
def test_a_captured_step_trains_as_the_eager_step(one_thread, method):
    """Weights, BatchNorm statistics, MoCo's key encoder, bank and its position (which wraps mid-batch once
    the short batches have shifted it), and the epochs' losses: all equal. The eager step augments in the
    CPU's host form, the captured one in the sync-free form, which equal each other bit for bit."""
    cpu = torch.device("cpu")
    eager_losses, eager, _ = _train(method, cpu, _eager)
    losses, graphed, step = _train(method, cpu, _pinned)
    assert losses == eager_losses
    assert eager.keys() == graphed.keys()
    for key, value in eager.items():
        assert torch.equal(value, graphed[key]), key
    # epoch 1: three warm-up steps, a capture, two replays, the short batch eager; epoch 2: five replays at
    # its learning rate, the short batch eager
    assert step.captures == 1


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("group", [dict(momentum=0.9, weight_decay=1e-4), dict(momentum=0.9, nesterov=True),
                                   dict(momentum=0.5, dampening=0.1, weight_decay=5e-4), dict(momentum=0.0)])
def test_sgd_update_equals_torch_sgd(group, foreach):
    """The captured update (a device tensor for the rate) against torch.optim.SGD over five steps whose
    rates change every step (a warm-up's), after the first step that makes the momentum buffers: the loop
    bit for bit, the multi-tensor form (a GPU's) to float32 rounding."""
    gen = torch.Generator().manual_seed(0)
    ours = [torch.randn(7, 3, generator=gen), torch.randn(5, generator=gen)]
    theirs = [p.clone().requires_grad_() for p in ours]
    reference = torch.optim.SGD(theirs, lr=0.1, **group)
    lr = torch.zeros(())
    buffers: list = [None, None]
    for k, rate in enumerate((0.1, 0.013, 0.07, 0.0123456789, 0.5)):
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        for p, g in zip(theirs, grads, strict=True):
            p.grad = g.clone()
        reference.param_groups[0]["lr"] = rate
        reference.step()
        if k == 0:  # torch's first step makes the buffers: the captured update starts from them
            ours = [p.detach().clone() for p in theirs]
            buffers = [reference.state[p].get("momentum_buffer") for p in theirs]
            buffers = [None if b is None else b.clone() for b in buffers]
            continue
        lr.fill_(rate)
        sgd_update(ours, grads, buffers, lr, weight_decay=group.get("weight_decay", 0.0),
                   momentum=group["momentum"], dampening=group.get("dampening", 0.0),
                   nesterov=group.get("nesterov", False), foreach=foreach)
        for p, q in zip(ours, theirs, strict=True):
            if foreach:
                assert torch.allclose(p, q.detach(), rtol=1e-6, atol=1e-7), k
            else:
                assert torch.equal(p, q.detach()), k


def test_a_warm_up_replays_one_graph_at_every_rate(one_thread):
    """A rate that changes every step (``warmup_epochs``, pretrain.train.warm_lr) is read from the device
    by the one graph: the run equals the eager one bit for bit with a single capture, where a rate inside
    the graph was captured again at every step."""
    cpu = torch.device("cpu")
    eager_losses, eager, _ = _train("mocov2", cpu, _eager, warm=True)
    losses, graphed, step = _train("mocov2", cpu, _pinned, warm=True)
    assert losses == eager_losses
    for key, value in eager.items():
        assert torch.equal(value, graphed[key]), key
    assert step.captures == 1


def test_the_stand_in_catches_a_step_that_moves_a_tensor():
    """The check can fail: a momentum update that rebinds the key encoder's weights (``p.data = ...``, as
    lightly's update once did) would leave a real graph reading the old ones."""
    cpu = torch.device("cpu")

    def rebinding(method, optimizer):
        def after_step():
            for p, k in zip(method.backbone.parameters(), method.key_backbone.parameters(), strict=True):
                k.data = k.data * 0.99 + p.data * 0.01
        method.after_step = after_step
        return _pinned(method, optimizer)
    with pytest.raises(RuntimeError, match="moved"):
        _train("mocov2", cpu, rebinding)


def test_a_graph_needs_cuda_and_a_warm_up():
    cfg = PretrainConfig(method="simsiam", width=0.25, size=16, batch_size=8, method_args=HEADS["simsiam"])
    method = build_method(cfg, None, torch.device("cpu"))
    optimizer, _ = make_optimizer(method, cfg)
    with pytest.raises(ValueError, match="CUDA"):
        make_step(method, method, optimizer, torch.device("cpu"), amp=False, graph=True)
    with pytest.raises(ValueError, match="warm-up"):
        GraphedStep(method, method, optimizer, eager_capture, warm_steps=0)
    assert type(make_step(method, method, optimizer, torch.device("cpu"), amp=False, graph=False)) is Step


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["simsiam", "mocov2"])
def test_a_cuda_graph_trains_as_the_eager_step(method):
    """On a GPU, a real capture against eager: the same kernels, but cuDNN may choose other algorithms
    between the two runs, so 1e-4 relative L2 per tensor after 12 steps (SimSiam amplifies rounding)."""
    cuda = torch.device("cuda")
    eager_losses, eager, _ = _train(method, cuda, _eager)

    def real(method_, optimizer):
        return GraphedStep(method_, method_, optimizer, cuda_capture, side_stream=cuda_side_stream)
    losses, graphed, step = _train(method, cuda, real)
    assert step.captures == 1
    assert losses == pytest.approx(eager_losses, rel=1e-4)
    for key, value in eager.items():
        if value.is_floating_point():
            diff = (graphed[key].double() - value.double()).norm().item()
            assert diff <= 1e-4 * value.double().norm().item() + 1e-8, key
        else:
            assert torch.equal(value, graphed[key]), key


@pytest.mark.gpu
def test_pretrain_runs_with_a_cuda_graph(tmp_path):
    """The CLI end to end on a GPU: two epochs (two learning rates, one capture) with a short last batch."""
    import json

    from pretrain.cli import main
    out = tmp_path / "g.ckpt"
    code = main(["fps", "--width", "0.25", "--size", "16", "--epochs", "2", "--batch-size", "8",
                 "--pairs-per-epoch", "60", "--device", "cuda", "--quiet", "--cuda-graph", "--out", str(out)])
    assert code == 0 and out.is_file()
    rows = [json.loads(line) for line in (tmp_path / "g.run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["steps"] for r in rows] == [8, 8] and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
