"""`analyze landscape`: plane math (anchors, PCA, filter-normalised random directions) and tiny runs."""

import dataclasses
import json
import shutil

import pytest
import torch
from PIL import Image
from torch import nn

from analysis import landscape
from analysis.cli import main
from analysis.landscape import anchor_plane, flatten, pca_plane, project, random_plane, unflatten, vector_keys
from analysis.output import DPI, FIGSIZE
from federated.datasets import DataConfig, load_dataset
from federated.experiment import FederateConfig, RunOptions
from federated.runner import run


def _vectors(n, p=40, seed=0):
    return torch.randn(n, p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    return net


def test_anchor_models_project_to_the_unit_corners():
    a, b, c = _vectors(3)
    plane = anchor_plane(a, b, c)
    assert torch.allclose(plane.basis @ plane.basis.T, torch.eye(2, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(project(plane, torch.stack([a, b, c])),
                          torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64), atol=1e-10)
    assert torch.allclose(plane.point([1.0, 0.0]), b) and torch.allclose(plane.point([0.0, 1.0]), c)


@pytest.mark.parametrize("kind", ["anchors", "pca", "random"])
def test_projection_recovers_plot_coordinates(kind):
    vecs = _vectors(4, seed=1)
    if kind == "anchors":
        plane = anchor_plane(*vecs[:3])
    elif kind == "pca":
        plane = pca_plane(vecs)
    else:
        net = _net()
        keys = vector_keys(net.state_dict())
        plane = random_plane(net.state_dict(), keys, torch.Generator().manual_seed(0))
    coords = torch.tensor([[0.3, -0.7], [2.0, 0.5], [0.0, 0.0]], dtype=torch.float64)
    points = torch.stack([plane.point(c) for c in coords])
    assert torch.allclose(project(plane, points), coords, atol=1e-10)
    # least squares: a component orthogonal to the plane does not move the projection
    normal = torch.randn(points.shape[1], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    normal -= plane.basis.T @ (plane.basis @ normal)
    assert torch.allclose(project(plane, points + normal), coords, atol=1e-10)


def test_pca_plane_is_centred_and_holds_three_models():
    vecs = _vectors(3, seed=2)
    plane = pca_plane(vecs)
    assert torch.allclose(plane.origin, vecs.mean(0))
    assert torch.allclose(plane.basis @ plane.basis.T, torch.eye(2, dtype=torch.float64), atol=1e-12)
    points = torch.stack([plane.point(c) for c in project(plane, vecs)])
    assert torch.allclose(points, vecs, atol=1e-10)  # three points always lie in their PCA plane
    with pytest.raises(ValueError, match="collinear"):
        pca_plane(torch.stack([vecs[0], 2 * vecs[0], 3 * vecs[0]]))
    with pytest.raises(ValueError, match="collinear"):
        anchor_plane(vecs[0], 2 * vecs[0], 3 * vecs[0])


def test_random_directions_are_filter_normalised_and_skip_biases_and_batchnorm():
    state = _net().state_dict()
    keys = vector_keys(state)
    assert "1.num_batches_tracked" not in keys and "1.running_var" in keys
    plane = random_plane(state, keys, torch.Generator().manual_seed(3))
    assert torch.equal(plane.origin, flatten(state, keys))
    for direction in plane.directions():
        like = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
        d = unflatten(direction, like, keys)
        for key in keys:
            if state[key].dim() <= 1:  # biases, BatchNorm weight/bias and running statistics
                assert torch.all(d[key] == 0), key
            else:
                want = state[key].double().flatten(1).norm(dim=1)
                assert torch.allclose(d[key].flatten(1).norm(dim=1), want, rtol=1e-9), key
    d1, d2 = plane.directions()
    assert not torch.allclose(d1, d2)


def test_flatten_round_trip_and_clamped_running_variance():
    state = _net().state_dict()
    keys = vector_keys(state)
    back = unflatten(flatten(state, keys), state, keys)
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in state.items())
    low = dict(state, **{"1.running_var": torch.full((4,), 0.1)})
    plane = anchor_plane(flatten(state, keys), flatten(low, keys), flatten(state, keys) * 1.5)
    far = landscape.state_at(plane, (3.0, 0.0), state, keys)  # the variance extrapolates below zero
    assert (far["1.running_var"] >= 0).all() and (far["1.running_var"] == 0).any()
    assert torch.equal(far["1.num_batches_tracked"], state["1.num_batches_tracked"])


def test_grid_ranges():
    coords = torch.tensor([[0.0, 0.0], [0.5, 0.2]], dtype=torch.float64)
    xs, ys = landscape.grid_axes("anchors", coords, 5, 0.2)
    assert xs[0] == pytest.approx(-0.2) and xs[-1] == pytest.approx(1.2) and len(ys) == 5
    xs, ys = landscape.grid_axes("pca", coords, 3, 0.5)
    assert (xs[0], xs[-1]) == pytest.approx((-0.25, 0.75)) and (ys[0], ys[-1]) == pytest.approx((-0.1, 0.3))
    xs, ys = landscape.grid_axes("random", coords, 3, 0.5)
    assert (xs[0], xs[-1], ys[0], ys[-1]) == pytest.approx((-1.0, 1.0, -1.0, 1.0))


# ---- end to end on tiny digits runs ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One real one-round run, and copies whose final models are perturbed (a real run costs seconds)."""
    root = tmp_path_factory.mktemp("landscape")
    cfg = FederateConfig(dataset="digits", clients=2, rounds=1, local_epochs=1, arch="resnet20", width=0.25,
                         partition="iid", batch_size=64, eval_local=False)
    data = load_dataset(DataConfig("digits"))
    few = dataclasses.replace(data, train_x=data.train_x[:200], train_y=data.train_y[:200],
                              test_x=data.test_x[:100], test_y=data.test_y[:100])  # 200 images train in ~1 s
    run(cfg, RunOptions(out=root / "a", device="cpu", progress=False), data=few)
    for seed, name in ((1, "b"), (2, "c")):
        shutil.copytree(root / "a", root / name)
        final = torch.load(root / name / "final.pt", weights_only=True)
        gen = torch.Generator().manual_seed(seed)
        final["model"] = {k: v + 0.02 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                          for k, v in final["model"].items()}
        torch.save(final, root / name / "final.pt")
    shutil.copytree(root / "a", root / "wide")
    config = json.loads((root / "wide" / "config.json").read_text())
    config["config"]["federate"]["width"] = 0.5
    (root / "wide" / "config.json").write_text(json.dumps(config))
    return root


TINY = ["--grid", "3", "--eval-samples", "32", "--device", "cpu"]


def test_anchor_landscape_writes_the_figure_and_grid(runs, capsys):
    out = runs / "out"
    assert main(["landscape", *(str(runs / n) for n in "abc"), *TINY, "--out", str(out)]) == 0, \
        capsys.readouterr().err
    with Image.open(out / "landscape_anchors.png") as image:
        assert image.size == (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI)) == (600, 400)
    record = json.loads((out / "landscape_anchors.json").read_text())
    assert record["x"] == pytest.approx([-0.2, 0.5, 1.2]) and len(record["loss"]) == 3
    assert all(v is not None and v > 0 for row in record["loss"] for v in row)
    assert [r["name"] for r in record["runs"]] == ["a", "b", "c"]
    corners = [r["coords"] for r in record["runs"]]
    assert corners == [pytest.approx(c, abs=1e-6) for c in ([0, 0], [1, 0], [0, 1])]


@pytest.mark.parametrize("extra,names", [(["--plane", "pca", "--bn-recompute"], "abc"),
                                         (["--plane", "random", "--seed", "1"], "a")])
def test_pca_and_random_planes(runs, capsys, extra, names):
    out = runs / f"out{extra[1]}"
    assert main(["landscape", *(str(runs / n) for n in names), *TINY, *extra, "--out", str(out)]) == 0, \
        capsys.readouterr().err
    record = json.loads((out / f"landscape_{extra[1]}.json").read_text())
    assert (out / f"landscape_{extra[1]}.png").is_file() and len(record["runs"]) == len(names)
    if extra[1] == "random":
        assert record["runs"][0]["coords"] == pytest.approx([0, 0], abs=1e-9)
        assert record["x"][0] <= -1 and record["x"][-1] >= 1


@pytest.mark.parametrize("names,message", [
    (["a", "b"], "needs at least 3 runs"),
    (["a", "b", "wide"], "landscape needs runs of one architecture"),
])
def test_bad_input_exits_2(runs, capsys, names, message):
    assert main(["landscape", *(str(runs / n) for n in names), *TINY, "--out", str(runs / "bad")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
