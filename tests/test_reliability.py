"""Issue 31's defects, one test each (each failed on the code of 852bd01): silent wrong results, overwrites,
tracebacks instead of one line, durability. Imports sit inside the tests so that each fails on its own.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.test_robustness import FED, PRE, one_line_error


# ---- 1. a finished pre-training's checkpoint is the last epoch's, and so is its --keep-every file ----------
def test_a_kill_before_the_last_checkpoint_is_renamed_resumes_to_the_final_one(tmp_path):
    from fpsfl.demo.cli import pretrain_done
    from pretrain.cli import main as pretrain
    from tests.crash_sweep import Sweep

    def argv(root):
        return ["fps", *PRE, "--epochs", "2", "--pairs-per-epoch", "16", "--keep-every", "1", "--out",
                root / "s.ckpt"]
    sweep = Sweep("pretrain", pretrain, argv, lambda root: pretrain_done(root / "s.run", 2))
    sweep.record(tmp_path)
    out = str(tmp_path / "reference" / "s.ckpt")
    last = max(i for i, (kind, path) in enumerate(sweep.events, 1) if kind == "tmp" and path == out)
    sweep.crash_at(tmp_path, last)  # the old order had saved epoch 2's state before: "epoch 2/2" over epoch 1
    from fpsfl.base.checkpoint import load_checkpoint
    crashed = tmp_path / f"crash-{last:03d}"
    assert load_checkpoint(crashed / "s.ckpt")["epoch"] == 2 and (crashed / "s.e0002.ckpt").is_file()


# ---- 2. the demo never takes an unfinished pre-training for a finished one ---------------------------------
def test_the_demo_resumes_a_pretraining_that_stopped_after_its_first_epoch(tmp_path):
    from fpsfl.base.checkpoint import atomic_save
    from fpsfl.demo.cli import BUDGETS, _command, plan

    budget = BUDGETS["default"]  # 2 pre-training epochs
    run = tmp_path / "fps.run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (tmp_path / "fps.ckpt").write_bytes(b"epoch 1's checkpoint")  # pretrain writes --out after every epoch
    pre = plan(tmp_path, budget, "cpu")[0]
    assert not pre.finished() and "--resume" in _command(pre)  # killed before its first state: started again
    atomic_save({"done": 1}, run / "state.pt")
    assert not pre.finished() and "--resume" in _command(pre)
    atomic_save({"done": budget.pretrain_epochs}, run / "state.pt")
    assert pre.finished()


# ---- 3. a batch or client of one sample trains; --batch-size 1 is refused ----------------------------------
def test_a_client_of_one_sample_takes_its_steps(tmp_path):
    """ResNet18 at 32 px: its last BatchNorm sees a 1x1 map, one value per channel for one sample."""
    from federated.algorithms import FedAvg
    from federated.algorithms.base import ClientContext
    from federated.local import epoch_batches, local_train
    from federated.tasks.classification import ClassificationTask
    from pretrain.backbones import create_backbone
    from tests.federated.test_algorithms import synthetic

    batches = epoch_batches([torch.tensor([5])] * 3, 32, torch.Generator().manual_seed(0))
    assert [b.tolist() for b in batches] == [[5]] * 3
    assert len(epoch_batches([torch.arange(33)], 32, torch.Generator().manual_seed(0))) == 1  # as before
    data = synthetic()
    task = ClassificationTask(data.n_classes, 32)
    torch.manual_seed(0)
    model = task.build_model(create_backbone("resnet18", 1.0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = ClientContext(0, model, 0.01, 0.9, {})
    algo = FedAvg(FedAvg.Config(), [1], np.ones((1, data.n_classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss = local_train(model, optimizer, algo, ctx, task, data.train_x, data.train_y, batches,
                       torch.Generator().manual_seed(0))
    after = model.state_dict()
    assert ctx.steps == 3 and np.isfinite(loss) and loss > 0
    assert not torch.equal(before["head.weight"], after["head.weight"])
    assert all(m.training for m in model.modules())  # the one-value BatchNorm went back to train mode


def test_fedvc_with_one_example_trains_and_fednova_survives_a_client_of_no_steps(tmp_path):
    from federated.aggregate import fednova
    from federated.experiment import FederateConfig, RunOptions
    from federated.runner import run
    from tests.federated.test_algorithms import synthetic

    cfg = FederateConfig(width=0.25, clients=3, rounds=1, local_epochs=2, alpha=1.0, algo="fedvc",
                         algo_args={"examples": "1"}, eval_local=False)
    rows = run(cfg, RunOptions(out=tmp_path / "r", device="cpu", progress=False), synthetic())
    assert rows[0]["train_loss"] > 0  # it was 0.0: every client had skipped its only batch
    w = {"w": torch.tensor([1.0, 2.0])}
    moved = {"w": torch.tensor([0.0, 1.0])}
    out = fednova(w, [moved, w], [1.0, 1.0], [2, 0], 0.9)  # was ZeroDivisionError
    assert torch.isfinite(out["w"]).all() and not torch.equal(out["w"], w["w"])


def test_one_sample_batches_in_the_vectorised_engine_equal_the_sequential_loop(tmp_path):
    from tests.federated.test_algorithms import _cfg
    from tests.federated.test_batched import _close, _round

    cfg = _cfg("fedvc", clients=3, batch_size=12, local_epochs=2, algo_args={"examples": "1"})
    seq, _ = _round(tmp_path, cfg, 1, "seq")
    bat, _ = _round(tmp_path, cfg, 3, "bat")
    _close(seq, bat, rel=1e-4)  # float32, as tests/federated/test_batched.py (its float64 mode: see below)
    # Not compared in float64: there one-sample steps of the two engines differ by ~4% after one step while
    # batches of two agree to 1e-16 (torch's float64 CPU kernels for a channels-last batch of one, not
    # this code: in float32 the two agree to 1e-6 after a step).


def test_batch_size_one_is_refused_in_one_line(tmp_path, capsys):
    from federated.cli import main as federate

    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED, "--batch-size", "1"])
    assert "--batch-size must lie in [2, inf)" in err and not (tmp_path / "r").exists()


# ---- 4. 16-bit and transparent images --------------------------------------------------------------------
def test_sixteen_bit_grey_is_scaled_and_transparency_goes_on_black(tmp_path):
    from pretrain.folder import FolderError, load_image

    grey = np.array([[0, 257 * 64], [257 * 128, 65535]], dtype=np.uint16).repeat(8, 0).repeat(8, 1)
    Image.fromarray(grey).save(tmp_path / "x-ray.png")  # mode I;16
    assert Image.open(tmp_path / "x-ray.png").mode.startswith("I")
    got = load_image(str(tmp_path / "x-ray.png"), 16)
    assert got.shape == (16, 16, 3) and got[0, 0, 0] == 0 and got[0, 15, 0] == 64 and got[15, 0, 0] == 128
    assert got[15, 15, 0] == 255 and (got == 255).mean() < 0.3  # was 99% white
    rgba = np.zeros((16, 16, 4), np.uint8)
    rgba[..., 0] = 255  # red everywhere, opaque only in the left half
    rgba[:, :8, 3] = 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "cut-out.png")
    got = load_image(str(tmp_path / "cut-out.png"), 16)
    assert (got[:, :8] == [255, 0, 0]).all() and (got[:, 8:] == 0).all()  # was red everywhere
    Image.fromarray(np.ones((16, 16), np.float32)).save(tmp_path / "float.tiff")
    with pytest.raises(FolderError, match="float.tiff.*mode F"):
        load_image(str(tmp_path / "float.tiff"), 16)


# ---- 5. symlink loops: each real file once ----------------------------------------------------------------
def _twelve(root: Path) -> Path:
    (root / "a").mkdir(parents=True)
    for i in range(12):
        Image.fromarray(np.full((8, 8, 3), 20 * i, np.uint8)).save(root / "a" / f"{i:02d}.png")
    return root


def test_symlink_loops_list_every_real_image_once(tmp_path):
    from federated.datasets.inat_geo import _image_finder
    from pretrain.folder import FolderConfig, scan

    root = _twelve(tmp_path / "imgs")
    os.symlink(".", root / "a" / "self")  # ln -s . ROOT/a/self
    os.symlink("..", root / "a" / "up")  # a second loop: the walk went on for ever
    os.symlink("00.png", root / "a" / "zz-same.png")  # the same real file under another name
    paths, _, _ = scan(FolderConfig(str(root), 8, batch_size=4))
    assert len(paths) == 12 and len({os.path.realpath(p) for p in paths}) == 12
    find = _image_finder(str(root))
    assert find("07") == str(root / "a" / "07.png")


# ---- 6. resume compares the contents that decide the run -------------------------------------------------
def test_resume_refuses_a_regenerated_bank_or_changed_images(tmp_path):
    from fractals.ifs import sample_codes, save_bank
    from pretrain.recipe import PretrainConfig
    from pretrain.train import train
    from tests.pretrain.test_train import TINY, _opts

    bank = tmp_path / "bank.npz"
    save_bank(sample_codes(50, 0), bank)
    cfg = PretrainConfig(source="fps", method="simsiam", bank=str(bank), **{**TINY, "epochs": 2})
    train(cfg, _opts(tmp_path, "b", stop_after=1))
    save_bank(sample_codes(50, 1), bank)  # regenerated at the same path
    with pytest.raises(ValueError, match="data config differs"):
        train(cfg, _opts(tmp_path, "b", resume="yes"))
    root = _twelve(tmp_path / "imgs")
    cfg = PretrainConfig(source="images", method="simsiam", root=str(root), **{**TINY, "epochs": 2,
                                                                                "batch_size": 4})
    train(cfg, _opts(tmp_path, "i", stop_after=1))
    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(root / "a" / "05.png")  # same count, other image
    with pytest.raises(ValueError, match="data config differs"):
        train(cfg, _opts(tmp_path, "i", resume="yes"))
    for i in range(12, 16):  # four more images: another steps_per_epoch
        shutil.copy(root / "a" / "00.png", root / "a" / f"{i}.png")
    with pytest.raises(ValueError, match="data and steps_per_epoch config differs"):
        train(cfg, _opts(tmp_path, "i", resume="yes"))


def test_federate_resume_refuses_another_partition(tmp_path):
    from federated.experiment import FederateConfig, RunOptions
    from federated.partitions import PartitionError
    from federated.runner import run
    from tests.federated.test_algorithms import synthetic

    cfg = FederateConfig(width=0.25, clients=3, rounds=2, local_epochs=1, alpha=1.0, eval_local=False)
    run(cfg, RunOptions(out=tmp_path / "r", device="cpu", progress=False, stop_after=1), synthetic())
    with pytest.raises(PartitionError, match="partition drawn now differs"):  # other data, same settings
        run(cfg, RunOptions(out=tmp_path / "r", device="cpu", progress=False, resume=True),
            synthetic(n_train=120))


# ---- 7. overwrites refused in one line --------------------------------------------------------------------
def test_pretrain_out_is_locked_and_kept_apart_from_the_run_directory(tmp_path, capsys):
    from fpsfl.base.files import lock_file, unlock_file
    from pretrain.cli import main as pretrain

    out = tmp_path / "a.ckpt"
    fd = lock_file(tmp_path / ".a.ckpt.lock", "")  # another run, with another --run-dir, writes a.ckpt
    try:
        err = one_line_error(capsys, pretrain, ["fps", *PRE, "--pairs-per-epoch", "8", "--out", out,
                                                "--run-dir", tmp_path / "mine.run"])
    finally:
        unlock_file(tmp_path / ".a.ckpt.lock", fd)
    assert f"is being written by process {os.getpid()}" in err and not out.exists()
    run = tmp_path / "r.run"
    for argv in (["--out", run / "state.pt", "--run-dir", run], ["--out", run, "--run-dir", run]):
        err = one_line_error(capsys, pretrain, ["fps", *PRE, "--pairs-per-epoch", "8", *argv],
                             root=tmp_path)
        assert "the run directory" in err and not run.exists()


@pytest.mark.parametrize("leftover", ["config.json", "final.pt"])
def test_a_folder_with_a_config_or_a_final_model_is_not_reused(tmp_path, capsys, leftover):
    from federated.cli import main as federate

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / leftover).write_text("keep me")
    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED], root=tmp_path)
    assert leftover in err and (tmp_path / "r" / leftover).read_text() == "keep me"


def test_export_partitions_keeps_an_existing_manifest_and_refuses_a_file(tmp_path, capsys):
    from federated.cli import main as federate

    args = ["export-partitions", "--clients", "2", "--quiet", "--out"]
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "manifest.json").write_text('{"format": "another export"}')
    err = one_line_error(capsys, federate, [*args, tmp_path / "shards"], root=tmp_path)
    assert "already holds an export" in err
    (tmp_path / "file").write_text("x")
    err = one_line_error(capsys, federate, [*args, tmp_path / "file"], root=tmp_path)  # was FileExistsError
    assert "is a file" in err


# ---- 8. one line, not a traceback or a hang ---------------------------------------------------------------
@pytest.mark.parametrize("command, args, message", [
    ("federate", ["--min-replies", "inf"], "--min-replies expects a count N"),  # was OverflowError
    ("analyze", ["probe", "CKPT", "--input-size", "-1"], "--input-size: must lie in [1, inf)"),  # torch error
    ("fpsfl", ["demo", "--jobs", "-1"], "--jobs: must lie in [1, inf)"),  # hung for ever
    ("fpsfl", ["demo", "--jobs", "0"], "--jobs: must lie in [1, inf)"),
    ("fractals", ["bank", "--n", "1" + "0" * 30, "--out", "OUT/b.npz"], "too large"),  # OverflowError
    ("federate", ["--lr", "1e308"], "--lr is too large for int64 or float32"),  # RuntimeError from torch
])
def test_tracebacks_and_hangs_are_one_line(tmp_path, capsys, command, args, message):
    from analysis.cli import main as analyze
    from federated.cli import main as federate
    from fpsfl.demo.cli import main as fpsfl
    from fractals.cli import main as fractals
    from tests.test_robustness import ckpt

    main = {"federate": federate, "analyze": analyze, "fpsfl": fpsfl, "fractals": fractals}[command]
    args = [str(ckpt(tmp_path / "c.ckpt")) if a == "CKPT" else a.replace("OUT", str(tmp_path)) for a in args]
    base = ["--out", str(tmp_path / "r"), *FED] if command == "federate" else []
    assert message in one_line_error(capsys, main, [*base, *args])


def _shards(tmp_path: Path) -> Path:
    from federated.cli import main as federate

    assert federate(["export-partitions", "--clients", "2", "--quiet", "--out", str(tmp_path / "s")]) == 0
    return tmp_path / "s"


def test_a_truncated_bit_flipped_or_reindexed_shard_is_one_line(tmp_path):
    from federated.shards import ShardError, load_shard

    out = _shards(tmp_path)
    good = (out / "client-0001.npz").read_bytes()
    (out / "client-0001.npz").write_bytes(good[: len(good) // 2])  # partly copied: was zipfile.BadZipFile
    with pytest.raises(ShardError, match="partly copied shard"):
        load_shard(out, 1)
    flipped = bytearray(good)
    flipped[len(good) // 3] ^= 0x40
    (out / "client-0001.npz").write_bytes(bytes(flipped))
    with pytest.raises(ShardError, match="partly copied shard"):
        load_shard(out, 1)
    with np.load(out / "client-0000.npz") as npz:
        x, y, index = npz["x"], npz["y"], npz["index"].copy()
    index[[0, 1]] = index[[1, 0]]  # FedVC would map its pools to the wrong samples
    np.savez(out / "client-0000.npz", x=x, y=y, index=index)
    with pytest.raises(ShardError, match="do not match the manifest"):
        load_shard(out, 0)


# ---- 9. durability ---------------------------------------------------------------------------------------
def test_atomic_write_syncs_the_file_and_its_folder(tmp_path, monkeypatch):
    from fpsfl.base import files

    synced = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                      real(fd)))
    files.atomic_write(tmp_path / "x.json", lambda tmp: tmp.write_text("{}"))
    assert synced == [str(tmp_path / f".x.json.tmp{os.getpid()}"), str(tmp_path)]


def test_stale_temporary_files_of_a_run_are_removed_on_start(tmp_path):
    from fpsfl.base.rundir import RunDir
    from pretrain.cli import main as pretrain

    run = tmp_path / "a.run"
    (run / "local" / "round_0001").mkdir(parents=True)
    stale = [run / ".state.pt.tmp4242", run / "local" / "round_0001" / ".global.pt.tmp7",
             tmp_path / ".a.ckpt.tmp99", tmp_path / ".a.e0001.ckpt.tmp5"]
    for path in stale:
        path.write_bytes(b"half a file")
    (tmp_path / ".b.ckpt.tmp99").write_text("another run's")
    (run / "notes.tmp1").write_text("not ours: no leading dot")
    (run / ".notes.txt.tmp1").write_text("not ours: no file of a run")
    held = RunDir(run)
    held.acquire()
    held.release()
    assert not any(p.exists() for p in stale[:2])
    assert (run / "notes.tmp1").exists() and (run / ".notes.txt.tmp1").exists()
    shutil.rmtree(run)
    assert pretrain(["fps", *PRE, "--pairs-per-epoch", "8", "--out", str(tmp_path / "a.ckpt")]) == 0
    assert not any(p.exists() for p in stale) and (tmp_path / ".b.ckpt.tmp99").exists()
    assert json.loads((run / "config.json").read_text())["config"]["data"] == {}
