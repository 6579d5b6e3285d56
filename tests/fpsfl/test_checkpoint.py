"""The fpsfl-backbone/1 checkpoint contract: round trip, weights-only loading, refusal of anything else."""

import pickle

import pytest
import torch

from fpsfl.base.checkpoint import (
    FORMAT,
    CheckpointError,
    load_backbone_weights,
    load_checkpoint,
    make_checkpoint,
    save_checkpoint,
)
from pretrain.backbones import create_backbone


class Payload:  # an arbitrary object: unpickling it could run code, so it must be refused
    def __reduce__(self):
        return (print, ("this must never run",))


def _ckpt(arch="resnet20", width=0.5):
    torch.manual_seed(0)
    net = create_backbone(arch, width)
    return net, make_checkpoint(net, arch=arch, width=width, method="simsiam", source="fps", epoch=3,
                                config={"pretrain": {"size": 32, "crop": (0.2, 1.0)}})


def test_round_trip(tmp_path):
    net, ckpt = _ckpt()
    save_checkpoint(ckpt, tmp_path / "a.ckpt")
    loaded = load_checkpoint(tmp_path / "a.ckpt")
    assert loaded["format"] == FORMAT and loaded["arch"] == "resnet20" and loaded["epoch"] == 3
    assert loaded["config"]["pretrain"]["crop"] == [0.2, 1.0]  # plain types: tuples became lists
    fresh = create_backbone("resnet20", 0.5)
    names = load_backbone_weights(fresh, loaded)
    assert set(names) == set(net.state_dict())
    for key, value in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value)
    # the file is loadable with nothing but weights_only=True
    assert isinstance(torch.load(tmp_path / "a.ckpt", weights_only=True), dict)


def test_arbitrary_pickle_is_refused(tmp_path, capsys):
    _, ckpt = _ckpt()
    ckpt["config"]["evil"] = Payload()
    torch.save(ckpt, tmp_path / "evil.ckpt")
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        load_checkpoint(tmp_path / "evil.ckpt")
    assert "this must never run" not in capsys.readouterr().out
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}))  # not a torch file at all
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "plain.pkl")


@pytest.mark.parametrize("change", [{"format": "other/1"}, {"arch": None}, {"epoch": "3"},
                                    {"backbone": {"w": [1.0]}}])
def test_malformed_checkpoints_are_refused(tmp_path, change):
    _, ckpt = _ckpt()
    ckpt.update(change)
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "bad.ckpt")
    assert "\n" not in str(err.value)


def test_missing_file_and_wrong_arch(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "none.ckpt")
    _, ckpt = _ckpt("resnet20", 1.0)
    with pytest.raises(CheckpointError, match="does not fit"):
        load_backbone_weights(create_backbone("resnet32"), ckpt)


def test_save_is_atomic_and_leaves_no_temporary(tmp_path):
    _, ckpt = _ckpt()
    save_checkpoint(ckpt, tmp_path / "a.ckpt")
    save_checkpoint(ckpt, tmp_path / "a.ckpt")  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt"]
