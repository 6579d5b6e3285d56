"""2-D training-loss landscape through federated models (Chen et al., ICLR 2023, §6, Fig. 9; Li et al.,
NeurIPS 2018, "Visualizing the Loss Landscape of Neural Nets", §4-5).

A model is a vector: the floating-point entries of its state dict, flattened in a fixed key order. A plane
through weight space is drawn from the given runs' final global models and the training loss is evaluated
on a grid of it:

  anchors  the plane through the first three models; plot coordinates put them at (0,0), (1,0), (0,1)
  pca      origin at the mean of all models, axes along their top-2 principal directions
  random   around the first model, two filter-normalised random directions (Li et al. §4): each filter
           of a weight is rescaled to the norm of the model's filter; biases and BatchNorm are zero

Every given model is projected onto the plane by least squares and marked. BatchNorm running statistics
are part of the vector and are combined like the weights (the project's convention, see
:mod:`federated.oracle.evaluate`); a running variance that would become negative off the anchors is
clamped to 0.
With ``--bn-recompute`` they are left out of the vector and re-estimated on the training subset at every
point instead. Integer entries (``num_batches_tracked``) are copied from the origin's model.
"""

from __future__ import annotations

import argparse
import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from matplotlib.colors import LogNorm
from torch import Tensor
from tqdm import tqdm

from federated.oracle.combine import State
from federated.oracle.evaluate import Evaluator
from fpsfl.base.cli import INT, SEED, TEXT, UsageError, number, positive

from .output import FORCE_HELP, OUT_HELP, new_figure, output_dir, save_figure, write_json
from .runs import AnalysisError, Run, load_runs, rebuild

PLANES = ("anchors", "pca", "random")


# ---- pure math on flat vectors ---------------------------------------------------------------------------

def vector_keys(state: State, exclude: Sequence[str] = ()) -> list[str]:
    """The floating-point entries of ``state`` (minus ``exclude``), in state order: a model's coordinates."""
    skip = set(exclude)
    return [k for k, v in state.items() if v.is_floating_point() and k not in skip]


def flatten(state: State, keys: Sequence[str]) -> Tensor:
    """The entries ``keys`` of ``state`` as one float64 CPU vector (P,)."""
    return torch.cat([state[k].detach().reshape(-1).to("cpu", torch.float64) for k in keys])


def unflatten(vec: Tensor, like: State, keys: Sequence[str]) -> State:
    """A state shaped like ``like`` whose entries ``keys`` come from ``vec`` (cast to their dtype); the other
    entries (integer buffers, excluded ones) are ``like``'s."""
    out, start = dict(like), 0
    for k in keys:
        n = like[k].numel()
        out[k] = vec[start:start + n].reshape(like[k].shape).to(like[k].dtype)
        start += n
    if start != vec.numel():
        raise ValueError(f"vector of {vec.numel()} entries for a state of {start}")
    return out


@dataclass
class Plane:
    """point(c) = origin + Q^T (R c) for plot coordinates c (2,); Q (2, P) has orthonormal rows."""

    origin: Tensor  # (P,) float64
    basis: Tensor  # Q, (2, P) float64
    coef: Tensor  # R, (2, 2): plot coordinates -> coefficients along the rows of Q

    def directions(self) -> Tensor:
        """The plot axes as weight-space vectors (2, P): point((1, 0)) - origin, point((0, 1)) - origin."""
        return self.coef.T @ self.basis

    def point(self, coords: Sequence[float] | Tensor) -> Tensor:
        c = torch.as_tensor(coords, dtype=torch.float64)
        return self.origin + self.basis.T @ (self.coef @ c)


def _from_directions(origin: Tensor, d: Tensor, what: str) -> Plane:
    """The plane of origin + d^T c with d (2, P), via the reduced QR decomposition d^T = Q^T R."""
    q, r = torch.linalg.qr(d.T)  # (P, 2), (2, 2)
    if abs(r[1, 1]) <= 1e-10 * abs(r[0, 0]) or r[0, 0] == 0:
        raise ValueError(f"the {what} span no plane (they are collinear); choose other runs")
    return Plane(origin, q.T.contiguous(), r)


def anchor_plane(a: Tensor, b: Tensor, c: Tensor) -> Plane:
    """The plane through three models with a at (0,0), b at (1,0) and c at (0,1)."""
    return _from_directions(a, torch.stack([b - a, c - a]), "three anchor models")


def pca_plane(vectors: Tensor) -> Plane:
    """Origin at the mean of ``vectors`` (n, P), axes the top-2 principal directions (unit length)."""
    if vectors.shape[0] < 3:
        raise ValueError(f"a PCA plane needs at least 3 models, got {vectors.shape[0]}")
    mean = vectors.mean(0)
    _, s, vh = torch.linalg.svd(vectors - mean, full_matrices=False)
    if s[1] <= 1e-10 * s[0] or s[0] == 0:
        raise ValueError("the models span no plane (they are collinear); choose other runs")
    return Plane(mean, vh[:2].contiguous(), torch.eye(2, dtype=torch.float64))


def filter_normalised(state: State, keys: Sequence[str], generator: torch.Generator) -> Tensor:
    """One random direction (P,) as in Li et al. §4: Gaussian, each filter (slice along dim 0) rescaled to the
    norm of the model's filter; entries of one dimension or less (biases, BatchNorm) are zero."""
    parts = []
    for k in keys:
        w = state[k].detach().to("cpu", torch.float64)
        if w.dim() <= 1:
            parts.append(torch.zeros(w.numel(), dtype=torch.float64))
            continue
        d = torch.randn(w.shape, generator=generator, dtype=torch.float64).reshape(w.shape[0], -1)
        w = w.reshape(w.shape[0], -1)
        d = d * (w.norm(dim=1, keepdim=True) / d.norm(dim=1, keepdim=True).clamp_min(1e-30))
        parts.append(d.reshape(-1))
    return torch.cat(parts)


def random_plane(state: State, keys: Sequence[str], generator: torch.Generator) -> Plane:
    """The plane around ``state`` spanned by two filter-normalised random directions (Li et al. §4)."""
    d = torch.stack([filter_normalised(state, keys, generator) for _ in range(2)])
    return _from_directions(flatten(state, keys), d, "random directions")


def project(plane: Plane, vectors: Tensor) -> Tensor:
    """Plot coordinates (n, 2) of the points of the plane nearest to ``vectors`` (n, P) (least squares)."""
    coefficients = (vectors - plane.origin) @ plane.basis.T  # (n, 2), Q has orthonormal rows
    return torch.linalg.solve(plane.coef, coefficients.T).T


def distance_to(plane: Plane, vectors: Tensor) -> Tensor:
    """Euclidean distance (n,) of each vector from the plane."""
    return (vectors - torch.stack([plane.point(c) for c in project(plane, vectors)])).norm(dim=1)


def grid_axes(plane_kind: str, coords: Tensor, n: int, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """The grid's x and y values: [-margin, 1 + margin] for anchors; otherwise the span of the projected
    models widened by margin x its extent on each side (random: at least [-1, 1])."""
    if plane_kind == "anchors":
        return np.linspace(-margin, 1 + margin, n), np.linspace(-margin, 1 + margin, n)
    axes = []
    for values in coords.T.numpy():
        lo, hi = float(values.min()), float(values.max())
        extent = hi - lo if hi > lo else 1.0
        lo, hi = lo - margin * extent, hi + margin * extent
        if plane_kind == "random":
            lo, hi = min(lo, -1.0), max(hi, 1.0)
        axes.append(np.linspace(lo, hi, n))
    return axes[0], axes[1]


def state_at(plane: Plane, coords: Sequence[float], like: State, keys: Sequence[str]) -> State:
    """The model at plot coordinates ``coords``; negative running variances are clamped to 0."""
    state = unflatten(plane.point(coords), like, keys)
    return {k: v.clamp_min(0) if k.endswith("running_var") else v for k, v in state.items()}


# ---- the command -------------------------------------------------------------------------------------------

def _check_runs(runs: list[Run], plane: str) -> None:
    if plane in ("anchors", "pca") and len(runs) < 3:
        raise AnalysisError(f"--plane {plane} needs at least 3 runs, got {len(runs)}; pass three or more run "
                            f"directories (or use --plane random)")
    kinds = {(r.config.dataset, r.config.arch, r.config.width) for r in runs}
    if len(kinds) > 1:
        listed = ", ".join(f"{r.name} ({r.config.dataset} {r.config.arch} x{r.config.width:g})" for r in runs)
        raise AnalysisError(f"runs {listed} have different architectures or datasets; landscape needs runs "
                            f"of one architecture")


def _load_states(runs: list[Run]) -> list[State]:
    states = [r.final_state() for r in runs]
    shapes = [{k: tuple(v.shape) for k, v in s.items()} for s in states]
    for run, shape in zip(runs[1:], shapes[1:], strict=True):
        if shape != shapes[0]:
            raise AnalysisError(f"runs {runs[0].name} and {run.name} have different architectures (their "
                                f"models have different entries, e.g. another algorithm's extra modules); "
                                f"landscape needs runs of one architecture")
    return states


def _check_fits(model: State, state: State, run: Run) -> None:
    """The runs' models must fit the model rebuilt from the config: not so when the data changed since
    (another number of classes at --data-root), which load_state_dict would answer with a traceback."""
    wrong = [k for k, v in state.items() if k not in model or tuple(model[k].shape) != tuple(v.shape)]
    if wrong or set(model) - set(state):
        first = wrong[0] if wrong else sorted(set(model) - set(state))[0]
        raise AnalysisError(f"{run.name}'s final.pt does not fit the model rebuilt from its config (e.g. "
                            f"{first}): has the {run.config.dataset} data changed since the run?")


def _batched(task, batch_size: int):
    """The task, evaluating in batches of ``batch_size`` where its evaluate takes one (classification)."""
    if "batch_size" not in inspect.signature(task.evaluate).parameters:
        return task
    return SimpleNamespace(evaluate=functools.partial(task.evaluate, batch_size=batch_size),
                           eval_inputs=task.eval_inputs)


def _make_plane(kind: str, states: list[State], keys: list[str], vectors: Tensor, seed: int) -> Plane:
    try:
        if kind == "anchors":
            return anchor_plane(vectors[0], vectors[1], vectors[2])
        if kind == "pca":
            return pca_plane(vectors)
        return random_plane(states[0], keys, torch.Generator().manual_seed(seed))
    except ValueError as exc:
        raise AnalysisError(f"--plane {kind}: {exc}") from None


def _plot(path, xs, ys, losses: np.ndarray, coords: np.ndarray, names: list[str], kind: str, axis_names,
          model_losses: list[float]):
    fig, (ax,) = new_figure()
    finite = losses[np.isfinite(losses)]
    if finite.size:
        # losses span decades off the models: log-spaced contours from the lowest loss up to 10x the
        # highest loss of a given model; anything higher shares the top colour (the JSON has every value)
        lo = max(float(finite.min()), 1e-8)
        cap = 10 * max((v for v in model_losses if np.isfinite(v)), default=np.inf)
        hi = max(min(float(finite.max()), cap), lo * 1.01)
        levels = np.geomspace(lo, hi, 16)
        filled = ax.contourf(xs, ys, np.ma.masked_invalid(losses), levels=levels, extend="max",
                             norm=LogNorm(vmin=lo, vmax=hi), cmap="viridis")
        ax.contour(xs, ys, np.ma.masked_invalid(losses), levels=levels, colors="k", linewidths=0.3)
        fig.colorbar(filled, ax=ax, label="training loss", format="%.3g")
    ax.scatter(coords[:, 0], coords[:, 1], c="red", marker="*", s=80, zorder=3)
    for (x, y), name in zip(coords, names, strict=True):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8, zorder=4,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "alpha": 0.7, "lw": 0})
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(ys[0], ys[-1])
    ax.set_xlabel(axis_names[0])
    ax.set_ylabel(axis_names[1])
    ax.set_title(f"training loss, {kind} plane")
    save_figure(fig, path)


def _training_subset(s, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """A fixed, seeded subset of ``n`` training images and labels (on the data's device)."""
    n = min(n, len(s.data.train_y))
    index = torch.randperm(len(s.data.train_y), generator=torch.Generator().manual_seed(seed))[:n]
    index = index.sort().values.to(s.data.train_y.device)
    return s.data.train_x[index], s.data.train_y[index]


def _evaluate_grid(evaluate: Evaluator, plane: Plane, xs: np.ndarray, ys: np.ndarray, like: State,
                   keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy at every grid point, arrays (len(ys), len(xs)) as contour expects."""
    losses = np.full((len(ys), len(xs)), np.nan)
    accs = np.full_like(losses, np.nan)
    points = [(j, i) for j in range(len(ys)) for i in range(len(xs))]
    for j, i in tqdm(points, desc="landscape", unit="point", dynamic_ncols=True):
        metrics = evaluate(state_at(plane, (xs[i], ys[j]), like, keys))
        losses[j, i], accs[j, i] = metrics["loss"], metrics["acc"]
    return losses, accs


def _axis_names(kind: str, plane: Plane, vectors: Tensor, coords: Tensor, names: list[str]) -> list[str]:
    if kind == "pca":
        spread = ((vectors - plane.origin) ** 2).sum()
        return [f"PC{k + 1} ({100 * float((coords[:, k] ** 2).sum() / spread):.0f}% of the spread)"
                for k in range(2)]
    if kind == "anchors":
        return [f"towards {names[1]}", f"towards {names[2]}"]
    return ["random direction 1 (filter-normalised)", "random direction 2 (filter-normalised)"]


def run_landscape(args: argparse.Namespace) -> None:
    if args.grid < 2:
        raise UsageError(f"--grid must be at least 2, got {args.grid}")
    positive("--eval-samples", args.eval_samples)
    positive("--batch-size", args.batch_size)
    runs = load_runs(args.runs)
    _check_runs(runs, args.plane)
    out = output_dir(args.out, runs, writes=(f"landscape_{args.plane}.png", f"landscape_{args.plane}.json"),
                     force=args.force)
    states = _load_states(runs)
    s = rebuild(runs[0], args.device)
    _check_fits(s.model.state_dict(), states[0], runs[0])
    # with --bn-recompute the running statistics are re-estimated at each point, so they are no coordinates
    exclude = [name for name, _ in s.model.named_buffers()] if args.bn_recompute else []
    keys = vector_keys(states[0], exclude)
    vectors = torch.stack([flatten(st, keys) for st in states])  # (n, P)
    plane = _make_plane(args.plane, states, keys, vectors, args.seed)
    coords = project(plane, vectors)  # (n, 2)

    x, y = _training_subset(s, args.eval_samples, args.seed)
    evaluate = Evaluator(s.model, _batched(s.task, args.batch_size), x, y,
                         recompute=(x, y) if args.bn_recompute else None, batch_size=args.batch_size)
    xs, ys = grid_axes(args.plane, coords, args.grid, args.margin)
    # integer buffers come from the first run: the origin of the anchors and random planes
    losses, accs = _evaluate_grid(evaluate, plane, xs, ys, states[0], keys)
    model_metrics = [evaluate(st) for st in states]

    names = [r.name for r in runs]
    axis_names = _axis_names(args.plane, plane, vectors, coords, names)
    png = out / f"landscape_{args.plane}.png"
    _plot(png, xs, ys, losses, coords.numpy(), names, args.plane, axis_names,
          [m["loss"] for m in model_metrics])
    off = distance_to(plane, vectors)
    write_json(out / f"landscape_{args.plane}.json", {
        "plane": args.plane, "seed": args.seed, "eval_samples": len(y), "bn_recompute": args.bn_recompute,
        "axes": axis_names, "x": xs.tolist(), "y": ys.tolist(),
        "loss": losses.tolist(), "acc": accs.tolist(),  # [y index][x index], on the training subset
        "runs": [{"name": r.name, "path": str(r.path), "coords": c.tolist(), "off_plane": float(d),
                  "relative_off_plane": float(d / v.norm()), "loss": m["loss"], "acc": m["acc"]}
                 for r, c, d, v, m in zip(runs, coords, off, vectors, model_metrics, strict=True)],
    })
    print(f"landscape ({args.plane} plane, {args.grid}x{args.grid} points, {len(y)} training images): {png}")


def register(sub) -> None:
    p = sub.add_parser("landscape", help="2-D training-loss landscape through final models (Fig. 9)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="federate run directories (one architecture)")
    p.add_argument("--plane", choices=PLANES, default="anchors",
                   help="anchors: through the first three runs (default); pca: of all runs; random: "
                        "filter-normalised directions around the first run")
    p.add_argument("--grid", type=INT, default=21, help="points per axis (default 21)")
    p.add_argument("--margin", type=number(float, "[0, inf)"), default=0.2,
                   help="grid margin beyond the models, in plot units (anchors) or x the models' extent")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the random directions and training subset")
    p.add_argument("--eval-samples", type=INT, default=2000, help="training images per grid point")
    p.add_argument("--batch-size", type=INT, default=1000, help="evaluation batch size (images)")
    p.add_argument("--bn-recompute", action="store_true",
                   help="re-estimate BatchNorm statistics on the training subset at every point")
    p.add_argument("--device", type=TEXT, default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--out", type=TEXT, default=None, help=OUT_HELP)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(run=run_landscape)
