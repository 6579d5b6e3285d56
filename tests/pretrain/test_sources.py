"""The fractal sources' render workers (issue 40): started once for the whole run, they hand over the same
batches, in the same order, as the stream rendered in the training process."""

from __future__ import annotations

import torch

from pretrain.recipe import PretrainConfig
from pretrain.sources import SOURCES

CFG = PretrainConfig(size=16, batch_size=8, pairs_per_epoch=20, seed=3)  # 3 batches, the last short
CPU = torch.device("cpu")


def epochs(source, n: int) -> list[list[dict]]:
    return [list(source.batches(e)) for e in range(n)]


def assert_same(a: list[list[dict]], b: list[list[dict]]) -> None:
    assert [len(x) for x in a] == [len(x) for x in b]
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x, y, strict=True):
            assert p.keys() == q.keys()
            assert all(torch.equal(p[k], q[k]) for k in p)


def test_persistent_workers_give_the_in_process_batches_every_epoch():
    alone = SOURCES["fps"].make(CFG, 0, CPU)
    workers = SOURCES["fps"].make(CFG, 2, CPU)
    expected, got = epochs(alone, 3), epochs(workers, 3)
    assert_same(got, expected)
    assert not torch.equal(expected[0][0]["images"], expected[1][0]["images"])  # epochs differ
    loader = workers._loader
    assert loader is not None and loader.persistent_workers and not loader.pin_memory  # pinned on a GPU only
    pids = {w.pid for w in loader._iterator._workers}
    assert_same([list(workers.batches(1))], [expected[1]])  # an epoch again, e.g. after --resume
    assert workers._loader is loader and {w.pid for w in loader._iterator._workers} == pids  # not restarted


def test_a_source_is_sharded_before_its_workers_start():
    source = SOURCES["fps"].make(CFG, 1, CPU)
    next(source.batches(0))
    try:
        source.shard(0, 2)
    except RuntimeError as exc:
        assert "before its first epoch" in str(exc)
    else:
        raise AssertionError("a shard after the workers started was accepted")


def test_the_fractal_settings_reach_the_renderer():
    """``--colours`` and ``--flips`` (issue 38's experiments) are the render config the stream draws with;
    the defaults are the paper look's: own colours, each view its own flips."""
    default = SOURCES["fps"].make(CFG, 0, CPU).stream.render
    assert (default.colours, default.flips) == ("own", True)
    cfg = PretrainConfig(size=16, batch_size=8, pairs_per_epoch=20, seed=3, colours="shared", flips="none")
    render = SOURCES["fps"].make(cfg, 0, CPU).stream.render
    assert (render.colours, render.flips) == ("shared", False)
    a, b = (next(iter(SOURCES["fps"].make(c, 0, CPU).batches(0)))["images"] for c in (CFG, cfg))
    assert not torch.equal(a, b)
