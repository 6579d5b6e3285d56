"""The pre-training loop and the `pretrain` CLI: every source runs, resume equals uninterrupted, bad input."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fpsfl.base.checkpoint import load_checkpoint
from fpsfl.base.rundir import RunDir, RunDirError
from pretrain import distributed
from pretrain.cli import main
from pretrain.recipe import PretrainConfig, RunOptions
from pretrain.schedules import LR_SCHEDULES, warmup
from pretrain.session import check_shared as _check_shared
from pretrain.signals import stage_of
from pretrain.sources import SOURCES
from pretrain.train import build_method, cosine_lr, make_optimizer, rng_states, set_lr, set_rng_states, train

TINY = {"arch": "resnet20", "width": 0.25, "size": 16, "batch_size": 8, "pairs_per_epoch": 16, "epochs": 1}
SMALL_HEADS = {"simsiam": {"proj_dim": 32, "pred_dim": 8}, "mocov2": {"hidden_dim": 32, "bank_size": 64}}


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    """A labelled folder of 3 classes x 6 small images (real PNG files)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"class{c}").mkdir()
        for i in range(6):
            pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")
    return root


def _config(source, method, root=None, **extra):
    return PretrainConfig(source=source, method=method, method_args=SMALL_HEADS.get(method, {}),
                          root=str(root) if root else None, n_classes=8, **{**TINY, **extra})


def _opts(tmp_path, name="run", **extra):
    return RunOptions(out=tmp_path / f"{name}.ckpt", run_dir=tmp_path / f"{name}.run", device="cpu",
                      workers=0, progress=False, **extra)


def test_cosine_schedule():
    assert cosine_lr(0.1, 0, 10) == pytest.approx(0.1)
    assert cosine_lr(0.1, 5, 10) == pytest.approx(0.05)
    assert cosine_lr(0.1, 10, 10) == pytest.approx(0.0)


@pytest.mark.parametrize("schedule", sorted(LR_SCHEDULES))
def test_every_schedule_starts_at_the_base_lr_and_is_what_the_run_logs(tmp_path, schedule):
    """Each epoch's logged lr is the schedule's value; cosine decays, constant stays at the base lr."""
    cfg = dataclasses.replace(_config("fps", "mocov2", epochs=3),
                              method_args={**SMALL_HEADS["mocov2"], "lr_schedule": schedule})
    train(cfg, _opts(tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "run.run" / "metrics.jsonl").read_text().splitlines()]
    base = cfg.method_config().lr * TINY["batch_size"] / 256  # the lr is per 256 samples
    assert [r["lr"] for r in rows] == pytest.approx([LR_SCHEDULES[schedule](base, e, 3) for e in range(3)])
    assert rows[0]["lr"] == pytest.approx(base)
    assert (rows[-1]["lr"] < base) == (schedule == "cosine")


def test_warmup_rises_linearly_to_one_and_is_off_at_zero():
    assert [warmup(p, 2.0) for p in (0.0, 0.5, 1.0, 2.0, 3.0)] == pytest.approx([0.0, 0.25, 0.5, 1.0, 1.0])
    assert warmup(0.0, 0.0) == warmup(0.3, 0.0) == 1.0


@pytest.mark.parametrize("schedule", sorted(LR_SCHEDULES))
def test_the_warm_up_sets_the_lr_of_every_step(tmp_path, monkeypatch, schedule):
    """With ``warmup_epochs=1.5`` over 3 epochs of 2 steps each, step k (1-based, counted over the run) trains
    at the schedule's rate times min(1, k / 3): the rate each step's optimizer holds is recorded."""
    import pretrain.train as train_module

    seen: list[float] = []
    real = train_module.make_step

    def recording(method, model, optimizer, *args, **kwargs):
        step = real(method, model, optimizer, *args, **kwargs)
        inner = step.__call__

        class Recorded:
            def __getattr__(self, name):
                return getattr(step, name)

            def __call__(self, *a, **k):
                seen.append(optimizer.param_groups[0]["lr"])
                return inner(*a, **k)
        return Recorded()

    monkeypatch.setattr(train_module, "make_step", recording)
    cfg = dataclasses.replace(_config("fps", "mocov2", epochs=3), method_args={
        **SMALL_HEADS["mocov2"], "lr_schedule": schedule, "warmup_epochs": 1.5})
    train(cfg, _opts(tmp_path))
    base = cfg.method_config().lr * TINY["batch_size"] / 256
    want = [LR_SCHEDULES[schedule](base, k // 2, 3) * min(1.0, (k + 1) / 3) for k in range(6)]
    assert seen == pytest.approx(want) and seen[0] < seen[1] < seen[2]
    rows = [json.loads(x) for x in (tmp_path / "run.run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx(want[1::2])  # the epoch's last step's rate


@pytest.mark.parametrize("method", sorted({m for spec in SOURCES.values() for m in spec.methods}))
def test_last_stage_lr_scales_the_deepest_stage_alone(method):
    """``last_stage_lr`` 0.25: every parameter in one group; layer3's (ResNet20's deepest stage) at a quarter
    of the rate the rest of its group gets, over the cosine; the first group, whose rate is logged,
    unscaled."""
    cfg = dataclasses.replace(_config("fps", method, epochs=4), method_args={
        **SMALL_HEADS.get(method, {}), "last_stage_lr": 0.25})
    built = build_method(cfg, 8, torch.device("cpu"))
    optimizer, base = make_optimizer(built, cfg)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    trained = [p for p in built.parameters() if p.requires_grad]
    assert len(params) == len({id(p) for p in params}) == len(trained)
    deep = {id(p) for n, p in built.backbone.named_parameters() if stage_of(n) == "layer3"}
    for epoch in range(4):
        lr = set_lr(optimizer, base, epoch, 4)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)  # what metrics.jsonl logs
        for g in optimizer.param_groups:
            inside = {id(p) in deep for p in g["params"]}
            assert len(inside) == 1  # a group is all deepest stage or none of it
            unscaled = base if g["fixed_lr"] else lr
            assert g["lr"] == pytest.approx(unscaled * (0.25 if inside == {True} else 1.0))
    assert any(id(p) in deep for p in optimizer.param_groups[-1]["params"])


def test_a_tiny_last_stage_lr_leaves_the_deepest_stage_at_its_init(tmp_path):
    """The rate reaches the weights: at ``last_stage_lr`` 1e-6 layer3 keeps its init (cosine 1 and its norm,
    no weight decay's shrink either) while conv1 turns as it does at 1; at 1 layer3 turns too."""
    def drift(scale, name):
        cfg = dataclasses.replace(_config("fps", "mocov2", epochs=1, init_scale=0.1), method_args={
            **SMALL_HEADS["mocov2"], "last_stage_lr": scale})
        train(cfg, _opts(tmp_path, name))
        return load_checkpoint(tmp_path / f"{name}.ckpt")["signals"]["drift"]

    slow, plain = drift(1e-6, "slow"), drift(1.0, "plain")
    turned = {k: {s: 1 - d[s]["cos"] for s in ("conv1", "layer3")}
              for k, d in (("slow", slow), ("plain", plain))}
    assert turned["plain"]["layer3"] > 1e-6 and turned["slow"]["layer3"] < 1e-3 * turned["plain"]["layer3"]
    assert slow["layer3"]["norm"] == pytest.approx(1, abs=1e-6)
    assert turned["slow"]["conv1"] > 1e-6
    assert turned["slow"]["conv1"] == pytest.approx(turned["plain"]["conv1"], rel=0.2)


@pytest.mark.parametrize("source,method", [(s, m) for s, spec in SOURCES.items() for m in spec.methods])
def test_every_source_and_method_trains_one_epoch(tmp_path, image_root, source, method):
    cfg = _config(source, method, image_root)
    last = train(cfg, _opts(tmp_path))
    assert np.isfinite(last["loss"]) and last["steps"] == 2 and 0 <= last["data_wait"] <= 1
    ckpt = load_checkpoint(tmp_path / "run.ckpt")
    assert (ckpt["arch"], ckpt["method"], ckpt["source"], ckpt["epoch"]) == ("resnet20", method, source, 1)
    assert not any(k.startswith(("projector", "head", "key_")) for k in ckpt["backbone"])  # backbone only
    rows = [json.loads(x) for x in (tmp_path / "run.run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1] and {"loss", "lr", "pairs_per_s", "z_std"} <= set(rows[0])
    saved = json.loads((tmp_path / "run.run" / "config.json").read_text())
    assert saved["config"]["pretrain"]["source"] == source and "code_version" in saved


@pytest.mark.parametrize("method,mode", [("simsiam", "auto"), ("mocov2", "yes")])
def test_resume_equals_uninterrupted(tmp_path, method, mode):
    cfg = _config("fps", method, epochs=2)
    train(cfg, _opts(tmp_path, "full"))
    train(cfg, _opts(tmp_path, "cut", stop_after=1, resume=mode if mode == "auto" else None))  # "killed"
    assert load_checkpoint(tmp_path / "cut.ckpt")["epoch"] == 1
    train(cfg, _opts(tmp_path, "cut", resume=mode))  # auto: the run directory holds a state, so it resumes
    full, cut = load_checkpoint(tmp_path / "full.ckpt"), load_checkpoint(tmp_path / "cut.ckpt")
    assert cut["epoch"] == 2
    for key, value in full["backbone"].items():
        assert torch.equal(value, cut["backbone"][key]), key
    losses = [[json.loads(x)["loss"] for x in (tmp_path / f"{n}.run" / "metrics.jsonl").open()]
              for n in ("full", "cut")]
    assert losses[0] == losses[1] and len(losses[0]) == 2


def test_under_torchrun_resume_defaults_to_auto(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node 1
    cfg = _config("fps", "simsiam", epochs=2)
    train(cfg, _opts(tmp_path, stop_after=1))  # no state: a new run
    assert train(cfg, _opts(tmp_path))["epoch"] == 2  # a state: resumed, not "already holds a run"
    assert [json.loads(x)["epoch"] for x in (tmp_path / "run.run" / "metrics.jsonl").open()] == [1, 2]
    with pytest.raises(RunDirError, match="already exists"):
        train(cfg, _opts(tmp_path, resume="no"))


def test_ranks_that_see_another_config_json_stop_with_one_line(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "run")
    run.create({"x": 1}, {})
    monkeypatch.setattr(distributed, "gather", lambda d, digest: [digest, "no file"])
    with pytest.raises(RunDirError) as error:
        _check_shared(run, distributed.Dist(rank=1, world=2))
    message = str(error.value)
    assert "\n" not in message and "rank 1: no file" in message and "storage that every node sees" in message
    monkeypatch.setattr(distributed, "gather", lambda d, digest: [digest, digest])
    _check_shared(run, distributed.Dist(rank=1, world=2))  # the same file: no error


def test_state_round_trips_rng_without_cuda(tmp_path, monkeypatch):
    train(_config("fps", "simsiam"), _opts(tmp_path))
    state = torch.load(tmp_path / "run.run" / "state.pt", weights_only=True)
    assert state["cuda_rng"] == [] and state["rng"].dtype == torch.uint8  # CUDA unused: none saved
    torch.manual_seed(123)
    expected = torch.rand(3)
    saved = {"rng": torch.manual_seed(123).get_state(), "cuda_rng": [torch.zeros(16, dtype=torch.uint8)]}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU run's state resumed on a CPU
    torch.manual_seed(7)
    set_rng_states(saved)
    assert torch.equal(torch.rand(3), expected)
    set_rng_states({"rng": saved["rng"]})  # a state from before CUDA states were saved
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.gpu
def test_cuda_rng_states_of_every_device_are_saved_and_restored():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.cuda.manual_seed_all(5)
    states = rng_states()
    assert len(states["cuda_rng"]) == torch.cuda.device_count()
    expected = [torch.rand(4, device=f"cuda:{i}").cpu() for i in range(torch.cuda.device_count())]
    set_rng_states(states)
    assert all(torch.equal(torch.rand(4, device=f"cuda:{i}").cpu(), e) for i, e in enumerate(expected))


@pytest.mark.gpu
def test_cuda_resume_equals_uninterrupted(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # else cuDNN's atomics differ run to run
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    cfg = _config("fps", "mocov2", size=32, epochs=2, batch_size=32, pairs_per_epoch=128)
    gpu = {"device": "cuda", "workers": 0}
    train(cfg, dataclasses.replace(_opts(tmp_path, "full"), **gpu))
    train(cfg, dataclasses.replace(_opts(tmp_path, "cut", stop_after=1), **gpu))
    train(cfg, dataclasses.replace(_opts(tmp_path, "cut", resume="yes"), **gpu))
    full, cut = load_checkpoint(tmp_path / "full.ckpt"), load_checkpoint(tmp_path / "cut.ckpt")
    assert all(torch.equal(v, cut["backbone"][k]) for k, v in full["backbone"].items())


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        train(_config("fps", "simsiam", seed=seed), _opts(tmp_path, name))
    a, b, c = (load_checkpoint(tmp_path / f"{n}.ckpt")["backbone"] for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def _cli(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


TINY_ARGS = ["--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "1", "--batch-size", "8",
             "--device", "cpu", "--quiet", "--method", "simsiam", "--set", "proj_dim=32", "--set",
             "pred_dim=8"]


def test_cli_writes_checkpoint_and_run_dir(tmp_path, capsys):
    out = tmp_path / "sub" / "fps.ckpt"
    code, stdout, _ = _cli(["fps", *TINY_ARGS, "--pairs-per-epoch", 16, "--out", out, "--profile"], capsys)
    assert code == 0 and "wrote" in stdout
    assert json.loads(stdout.splitlines()[0])["profile"]["pairs_per_s"] > 0
    assert load_checkpoint(out)["config"]["method"]["proj_dim"] == 32
    assert (tmp_path / "sub" / "fps.run" / "metrics.jsonl").is_file()
    # a second run into the same directory must not overwrite it
    code, _, err = _cli(["fps", *TINY_ARGS, "--pairs-per-epoch", 16, "--out", out], capsys)
    assert code == 2 and "--resume" in err


@pytest.mark.parametrize("args,message", [
    (["fps", "--arch", "resnet99"], "unknown"),
    (["fps", "--method", "byol"], "invalid choice"),
    (["fps", "--arch", "resnet18", "--size", "16"], "resnet18"),
    (["fps", "--arch", "mobilenet_v2", "--size", "48"], "mobilenet_v2"),
    (["fps", "--set", "tau=0.1"], "tau"),
    (["fps", "--set", "proj_dim=big"], "proj_dim"),
    (["fps", "--set", "lr_schedule=step"], "lr_schedule"),
    (["fps", "--epochs", "0"], "--epochs"),
    (["fps", "--resume"], "no training state"),
    (["fps", "--resume", "maybe"], "invalid choice"),
    (["fps", "--dist-timeout", "0"], "--dist-timeout"),
    (["fps", "--cuda-graph"], "--cuda-graph needs a CUDA device"),
    (["fps", "--out", "/proc/no/such/dir/x.ckpt"], "cannot write"),
    (["images"], "--root"),
    (["supervised", "--root", "/no/such/folder"], "/no/such/folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    if "--out" not in args:
        args = [*args, "--out", tmp_path / "x.ckpt"]
    code, _, err = _cli([*args, "--quiet", "--device", "cpu"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "x.run" / "metrics.jsonl").exists()


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["fps", "--help"])
    text = capsys.readouterr().out
    for flag in ("--arch", "--width", "--size", "--epochs", "--pairs-per-epoch", "--batch-size", "--method",
                 "--out", "--workers", "--device", "--amp", "--resume", "--seed", "--profile"):
        assert flag in text


@pytest.mark.slow
def test_mobilenet_v2_at_224_px(tmp_path, capsys):
    """The issue's acceptance run: a MobileNetV2 checkpoint at 224 px on CPU."""
    out = tmp_path / "mnv2.ckpt"
    code, _, err = _cli(["fps", "--arch", "mobilenet_v2", "--size", 224, "--epochs", 1, "--pairs-per-epoch",
                         64, "--batch-size", 16, "--device", "cpu", "--out", out, "--quiet"], capsys)
    assert code == 0, err
    assert load_checkpoint(Path(out))["arch"] == "mobilenet_v2"


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["simsiam", "mocov2"])
def test_gpu_bf16_channels_last_with_workers(tmp_path, method):
    cfg = _config("fps", method, size=32, batch_size=64, pairs_per_epoch=512, amp=True)
    opts = RunOptions(out=tmp_path / "g.ckpt", run_dir=tmp_path / "g.run", device="cuda", workers=2,
                      progress=False, profile=True)
    last = train(cfg, opts)
    assert np.isfinite(last["loss"]) and last["steps"] == 8 and last["compute_frac"] > 0
    assert all(v.device.type == "cpu" for v in load_checkpoint(tmp_path / "g.ckpt")["backbone"].values())
