"""FPS pair semantics and the baselines (Chen et al., ICLR 2023, §4.2, Fig. 2c, Table 6)."""

from dataclasses import replace

import numpy as np
import pytest

from fractals.ifs import sample_codes
from fractals.scenes import RenderConfig, fps_pairs, multilabel_images, render_batch, single_images


@pytest.fixture(scope="module")
def bank():
    return sample_codes(3000, seed=5)


def _crop(img):
    ys, xs = np.nonzero(img.max(-1))
    return img[ys.min(): ys.max() + 1, xs.min(): xs.max() + 1].max(-1) > 0


def _iou(a, b):
    h, w = min(a.shape[0], b.shape[0]), min(a.shape[1], b.shape[1])
    a, b = a[:h, :w], b[:h, :w]
    return (a & b).sum() / max((a | b).sum(), 1)


def test_views_share_codes_and_nothing_else(bank):
    # Freeze everything but the chaos game's draws and the placement: one code then gives the same shape
    # in both views, and different codes give different shapes.
    cfg = RenderConfig(size=48, points=20_000, jitter=(1.0, 1.0), flips=False, scale=(0.5, 0.5),
                       off_canvas=0.0, blur_p=0.0, saturation=(0.0, 0.0), value=(1.0, 1.0))
    codes = np.arange(10)[:, None]
    views = render_batch(bank, cfg, codes, np.ones(10, np.int64), np.arange(10, dtype=np.uint64), 2)
    same = [_iou(_crop(views[0, i]), _crop(views[1, i])) for i in range(10)]
    other = [_iou(_crop(views[0, i]), _crop(views[1, (i + 1) % 10])) for i in range(10)]
    assert np.median(same) > 0.85
    assert np.median(other) < 0.6
    assert not np.array_equal(views[0], views[1])  # placement differs


def test_two_instances_of_a_code_differ(bank):
    cfg = RenderConfig.preset(32, blur_p=0.0)
    views = render_batch(bank, cfg, np.arange(50)[:, None], np.ones(50, np.int64),
                         np.arange(50, dtype=np.uint64), 2)
    assert all(not np.array_equal(views[0, i], views[1, i]) for i in range(50))
    assert all(views[v, i].max() > 0 for v in range(2) for i in range(50))  # nothing renders empty


def test_pairs_use_distinct_codes(bank):
    cfg = RenderConfig.preset(32)
    views, codes, counts = fps_pairs(bank, cfg, 200, np.random.default_rng(0))
    assert views.shape == (2, 200, 32, 32, 3) and views.dtype == np.uint8
    assert np.all(counts == 2) and np.all(codes >= 0)
    for a, b in zip(codes[:-1], codes[1:], strict=True):
        assert len(set(a)) == len(a) and not set(a) & set(b)


def test_224_setting_draws_two_to_five_codes(bank):
    cfg = RenderConfig.preset(224, points=4000)
    views, codes, counts = fps_pairs(bank, cfg, 40, np.random.default_rng(1))
    assert views.shape == (2, 40, 224, 224, 3)
    assert counts.min() == 2 and counts.max() == 5 and len(np.unique(counts)) == 4
    assert np.all((codes >= 0).sum(1) == counts)


def test_same_seed_same_batch(bank):
    cfg = RenderConfig.preset(32)
    a = fps_pairs(bank, cfg, 16, np.random.default_rng(42))
    b = fps_pairs(bank, cfg, 16, np.random.default_rng(42))
    c = fps_pairs(bank, cfg, 16, np.random.default_rng(43))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_scene_depends_only_on_its_seed(bank):
    cfg = RenderConfig.preset(32)
    codes = np.arange(16).reshape(8, 2)
    seeds = np.arange(100, 108, dtype=np.uint64)
    full = render_batch(bank, cfg, codes, np.full(8, 2), seeds, 2)
    alone = render_batch(bank, cfg, codes[3:4], np.full(1, 2), seeds[3:4], 2)
    assert np.array_equal(full[:, 3], alone[:, 0])


def test_multilabel_labels_match_codes(bank):
    cfg = RenderConfig.preset(32, codes_per_image=(1, 4))
    images, labels, codes = multilabel_images(bank, cfg, 64, np.random.default_rng(0), n_classes=100)
    assert images.shape == (1, 64, 32, 32, 3) and labels.shape == (64, 100)
    for row, ids in zip(labels, codes, strict=True):
        ids = ids[ids >= 0]
        assert set(np.nonzero(row)[0]) == set(ids) and 1 <= len(ids) <= 4
    assert codes.max() < 100


def test_single_fractal_fills_the_view(bank):
    cfg = RenderConfig.preset(32, blur_p=0.0)
    images, codes = single_images(bank, cfg, 20, np.random.default_rng(0))
    assert images.shape == (1, 20, 32, 32, 3) and codes.shape == (20,)
    for img in images[0]:
        ys, xs = np.nonzero(img.max(-1))
        # the stretch fit spans both sides; a random patch may leave the outermost pixel row empty
        assert ys.min() <= 1 and ys.max() >= 30 and xs.min() <= 1 and xs.max() >= 30


def test_patch_splat_thickens_strokes(bank):
    base = RenderConfig.preset(32, blur_p=0.0, points=200, patch_p=0.0)
    args = (np.arange(30)[:, None], np.ones(30, np.int64), np.arange(30, dtype=np.uint64), 1)
    thin = render_batch(bank, base, *args)
    thick = render_batch(bank, replace(base, patch_p=1.0), *args)
    assert (thick.max(-1) > 0).sum() > 1.2 * (thin.max(-1) > 0).sum()


@pytest.mark.parametrize("bad", [dict(size=8), dict(points=0), dict(codes_per_image=(3, 2)),
                                 dict(scale=(0.0, 0.5)), dict(off_canvas=0.6), dict(blur_p=1.5)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        RenderConfig(**bad)


def test_render_batch_rejects_bad_shapes(bank):
    with pytest.raises(ValueError):
        render_batch(bank, RenderConfig(), np.zeros((4, 2)), np.full(4, 3), np.zeros(4, np.uint64), 2)


def test_the_paper_look_covers_more_and_is_smoother_than_the_sparse_look(bank):
    """The official generator's look: full-canvas renders resized down, 3x3 patches, colour then resize."""
    from fractals.stats import view_stats

    rng = np.random.default_rng(0)
    paper = view_stats(fps_pairs(bank, RenderConfig.preset(32), 60, rng)[0].reshape(-1, 32, 32, 3))
    rng = np.random.default_rng(0)
    sparse = view_stats(fps_pairs(bank, RenderConfig.preset(32, look="sparse"), 60, rng)[0].reshape(
        -1, 32, 32, 3))
    assert paper["coverage"] > sparse["coverage"] + 0.05
    assert paper["adjacent_difference"] < sparse["adjacent_difference"]
    assert paper["covered_value"] < sparse["covered_value"]


def test_view_stats_on_a_known_image():
    from fractals.stats import view_stats

    img = np.zeros((1, 4, 4, 3), np.uint8)
    img[0, 0, 0] = img[0, 0, 1] = (255, 255, 255)  # two covered, adjacent, white pixels
    img[0, 3, 3] = (0, 0, 51)  # one isolated dark blue pixel: value 0.2
    img[0, 2, 0] = (12, 0, 0)  # max(R, G, B) = 0.047 <= 0.05: not covered
    stats = view_stats(img)
    assert stats["coverage"] == pytest.approx(3 / 16) and stats["adjacent_difference"] == 0.0
    assert stats["covered_value"] == pytest.approx((1 + 1 + 0.2) / 3)
    assert stats["covered_mean"] == pytest.approx((3 + 3 + 0.2) / 9)


@pytest.mark.parametrize("look", ["paper", "sparse"])
def test_shared_views_place_one_grey_instance_and_independent_views_two(bank, look):
    """Issue 23: under ``shared`` both views of a pair place the same grey render of each code (same jitter,
    chaos-game points and patch) and differ only after it; under ``independent`` each view renders its own."""
    n, i, side = 12, 2, 32
    args = (np.arange(n * i).reshape(n, i), np.full(n, i), np.arange(n, dtype=np.uint64), 2)
    for instances in ("shared", "independent"):
        cfg = RenderConfig.preset(side, look=look, instances=instances, render_full=True)
        grey = np.zeros((2, n, i, side, side), np.float32)
        views = render_batch(bank, cfg, *args, grey=grey)
        assert (grey > 0).any(axis=(2, 3, 4)).all()  # every view placed a non-empty render
        same = [np.array_equal(grey[0, b, j], grey[1, b, j]) for b in range(n) for j in range(i)]
        assert all(same) if instances == "shared" else not any(same)
        assert all(not np.array_equal(views[0, b], views[1, b]) for b in range(n))  # colour, placement differ


def test_shared_and_independent_rows_render_alike(bank):
    """Shared instances keep a scene a function of its own seed, so a rank's rows equal the full batch's."""
    cfg = RenderConfig.preset(32, instances="shared")
    full = fps_pairs(bank, cfg, 16, np.random.default_rng(7))[0]
    rows = fps_pairs(bank, cfg, 16, np.random.default_rng(7), rows=slice(4, 12))[0]
    assert np.array_equal(full[:, 4:12], rows)
    other = fps_pairs(bank, replace(cfg, instances="independent"), 16, np.random.default_rng(7))[0]
    assert not np.array_equal(full, other)


def test_config_rejects_unknown_instances():
    with pytest.raises(ValueError, match="instances"):
        RenderConfig(instances="cached")


@pytest.mark.parametrize("floor", [True, False])
def test_placed_size_and_corner_follow_the_official_or_the_first_renderer(floor):
    """Official: side int(f S) and top-left in [-s//4, S - s + s//4); the first renderer rounded the side
    and closed the range on the right."""
    from fractals.draw import _placed_size, _top_left
    from fractals.scenes import _kernel_params

    side = 32
    prm = _kernel_params(RenderConfig.preset(side, floor_placement=floor))
    st = np.array([5], np.uint64)
    draws = {}
    for _ in range(40_000):
        size = _placed_size(st, prm, side)
        draws.setdefault(size, []).append(_top_left(st, prm, side, size))
    lo, hi = 0.45 * side, 0.75 * side
    want = range(int(lo), int(hi)) if floor else range(int(lo + 0.5), int(hi + 0.5) + 1)
    assert sorted(draws) == list(want)
    for size, corners in draws.items():
        corners = np.array(corners)
        last = side - size + size // 4 - (1 if floor else 0)
        assert corners.min() == -(size // 4) and corners.max() == last


@pytest.mark.parametrize("centre", [False, True])
def test_patch_centre_is_random_or_forced(centre):
    from fractals.draw import _patch_and_seed, _scratch
    from fractals.scenes import _kernel_params

    prm = _kernel_params(RenderConfig.preset(32, patch_centre=centre))
    work = _scratch(32, 1, prm)
    st = np.array([3], np.uint64)
    centres, sizes = [], []
    for _ in range(2000):
        _patch_and_seed(0, st, prm, work)
        centres.append(work[15][0, 1, 1])
        sizes.append(work[15][0].sum())
    assert np.all(centres) if centre else 0.45 < np.mean(centres) < 0.55
    assert min(sizes) == (1 if centre else 0) and max(sizes) == 9  # the official draws empty patches too


def test_sparse_look_keeps_the_first_renderers_details():
    from fractals.scenes import SPARSE_RESIDUALS

    sparse = RenderConfig.preset(32, look="sparse")
    assert all(getattr(sparse, k) == v for k, v in SPARSE_RESIDUALS.items())
    paper = RenderConfig.preset(32)
    assert (paper.fit, paper.hsv, paper.overwrite, paper.jitter_tries, paper.patch_centre) == (
        "stretch", "opencv", True, 4, False)


@pytest.mark.parametrize("bad", [dict(fit="square"), dict(hsv="hls"), dict(colour_first=False),
                                 dict(jitter_tries=-1)])
def test_config_rejects_bad_residuals(bad):
    with pytest.raises(ValueError):
        RenderConfig(**bad)


@pytest.mark.parametrize("colours", ["own", "shared"])
def test_shared_colours_make_a_pairs_views_alike_once_every_other_view_draw_is_pinned(bank, colours):
    """Issue 38's experiment: with each view's size, place, flips and blur pinned (the instance fills the
    view), the two views of a shared instance differ only in colour: equal under shared colours, unequal
    under own colours; view 0 is the same in both (its draws are those of own colours)."""
    pinned = RenderConfig.preset(32, scale=(1.0, 1.0), off_canvas=0.0, flips=False, blur_p=0.0,
                                 codes_per_image=(1, 1))
    n = 16
    args = (np.arange(n)[:, None], np.ones(n), np.arange(n, dtype=np.uint64), 2)
    views = render_batch(bank, replace(pinned, colours=colours), *args)
    own = render_batch(bank, pinned, *args)
    assert np.array_equal(views[0], own[0])
    same = [np.array_equal(views[0, b], views[1, b]) for b in range(n)]
    assert all(same) if colours == "shared" else not any(same)


def test_config_rejects_unknown_colours():
    with pytest.raises(ValueError, match="colours"):
        RenderConfig(colours="mixed")
