"""``pretrain --recipe`` (issue 38): a recipe's defaults reach the run's config, its method settings only
for its own method, and flags and ``--set`` win over them."""

from __future__ import annotations

import pytest

import pretrain.cli as pcli
from pretrain.recipe import DEFAULT_RECIPE, RECIPES


class _Captured(Exception):
    pass


def _config(monkeypatch, tmp_path, *flags: str):
    seen = {}

    def capture(cfg, opts):
        seen["cfg"] = cfg
        raise _Captured

    monkeypatch.setattr(pcli, "train", capture)
    with pytest.raises(_Captured):
        pcli.main(["fps", *flags, "--out", str(tmp_path / "x.ckpt"), "--device", "cpu"])
    return seen["cfg"]


def test_the_default_recipe_sets_its_method_and_settings(monkeypatch, tmp_path):
    recipe = RECIPES[DEFAULT_RECIPE]
    cfg = _config(monkeypatch, tmp_path)
    assert cfg.method == recipe.method and cfg.init_scale == recipe.init_scale
    assert cfg.method_args == dict(recipe.method_args)
    for key, value in recipe.method_args.items():  # and the method runs with them
        assert getattr(cfg.method_config(), key) == value


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_set_and_flags_win_over_a_recipe(monkeypatch, tmp_path, name):
    recipe = RECIPES[name]
    cfg = _config(monkeypatch, tmp_path, "--recipe", name, "--set", "temperature=0.3", "--method", "mocov2",
                  "--init-scale", "0.7")
    kept = dict(recipe.method_args) if recipe.method == "mocov2" else {}  # the recipe's other settings stay
    assert cfg.method_args.keys() == {*kept, "temperature"} and cfg.init_scale == 0.7
    method = cfg.method_config()  # --set gives text, typed by the method's config
    assert method.temperature == 0.3
    assert all(getattr(method, k) == v for k, v in kept.items() if k != "temperature")


def test_a_recipes_settings_stay_off_another_method(monkeypatch, tmp_path):
    """Settings of the recipe's method are not given to a method chosen with --method."""
    other = next(m for m in ("simsiam", "mocov2") if m != RECIPES[DEFAULT_RECIPE].method)
    cfg = _config(monkeypatch, tmp_path, "--method", other)
    assert cfg.method == other and cfg.method_args == {}
