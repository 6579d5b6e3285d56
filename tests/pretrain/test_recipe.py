"""``pretrain --recipe`` (issue 38): a recipe's defaults reach the run's config, its method settings only
for its own method, and flags and ``--set`` win over them."""

from __future__ import annotations

import json

import pytest

import pretrain.cli as pcli
from pretrain.recipe import DEFAULT_RECIPE, RECIPES


class _Captured(Exception):
    pass


def _config(monkeypatch, tmp_path, *flags: str, command: str = "fps"):
    seen = {}

    def capture(cfg, opts):
        seen["cfg"] = cfg
        raise _Captured

    monkeypatch.setattr(pcli, "train", capture)
    with pytest.raises(_Captured):
        pcli.main([command, *flags, "--out", str(tmp_path / "x.ckpt"), "--device", "cpu"])
    return seen["cfg"]


def test_the_default_recipe_sets_its_method_and_settings(monkeypatch, tmp_path):
    recipe = RECIPES[DEFAULT_RECIPE]
    cfg = _config(monkeypatch, tmp_path)
    values, args = recipe.settings("fps", recipe.method)
    assert cfg.method == recipe.method and cfg.init_scale == recipe.init_scale
    assert all(getattr(cfg, k) == v for k, v in values.items())
    assert cfg.method_args == args and set(recipe.method_args) <= set(args)
    for key, value in args.items():  # and the method runs with them
        assert getattr(cfg.method_config(), key) == value


def test_the_aligned_recipe_aligns_the_views_of_fps_pairs_only(monkeypatch, tmp_path):
    """``aligned`` colours a pair alike, places its fractals as rendered and turns the view flip off on
    fps; fractal-single's two views of one fractal keep the defaults, and a flag or --set wins."""
    fps = _config(monkeypatch, tmp_path, "--recipe", "aligned")
    assert (fps.colours, fps.flips, fps.method_config().flip_p) == ("shared", "none", 0.0)
    # the docs' no-flip runs, spelled out in flags: one config, so either spelling resumes the other
    flags = ("--colours", "shared", "--flips", "none", "--set", "flip_p=0")
    assert fps == _config(monkeypatch, tmp_path, "--recipe", "short", *flags)
    short = _config(monkeypatch, tmp_path, "--recipe", "short")
    assert (short.colours, short.flips, short.method_config().flip_p) == ("own", "own", 0.5)
    single = _config(monkeypatch, tmp_path, "--recipe", "aligned", "--method", "mocov2",
                     command="fractal-simsiam")
    assert single.init_scale == 0.1 and single.method_args == dict(RECIPES["aligned"].method_args)
    assert single.method_config().flip_p == 0.5
    mine = _config(monkeypatch, tmp_path, "--recipe", "aligned", "--colours", "own", "--set", "flip_p=0.3")
    assert (mine.colours, mine.flips, mine.method_config().flip_p) == ("own", "none", 0.3)
    simsiam = _config(monkeypatch, tmp_path, "--recipe", "aligned", "--method", "simsiam")
    assert simsiam.colours == "shared" and simsiam.method_args == {}  # the pairs, not mocov2's settings


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_set_and_flags_win_over_a_recipe(monkeypatch, tmp_path, name):
    recipe = RECIPES[name]
    cfg = _config(monkeypatch, tmp_path, "--recipe", name, "--set", "temperature=0.3", "--method", "mocov2",
                  "--init-scale", "0.7")
    kept = recipe.settings("fps", "mocov2")[1]  # the recipe's other settings stay
    assert cfg.method_args.keys() == {*kept, "temperature"} and cfg.init_scale == 0.7
    method = cfg.method_config()  # --set gives text, typed by the method's config
    assert method.temperature == 0.3
    assert all(getattr(method, k) == v for k, v in kept.items() if k != "temperature")


def test_a_recipes_settings_stay_off_another_method(monkeypatch, tmp_path):
    """Settings of the recipe's method are not given to a method chosen with --method."""
    other = next(m for m in ("simsiam", "mocov2") if m != RECIPES[DEFAULT_RECIPE].method)
    cfg = _config(monkeypatch, tmp_path, "--method", other)
    assert cfg.method == other and cfg.method_args == {}


def test_set_and_the_recipe_give_one_typed_setting(monkeypatch, tmp_path):
    """``--set temperature=0.5`` is the default recipe's own setting, not the text "0.5" beside it."""
    key, value = next(iter(RECIPES[DEFAULT_RECIPE].method_args.items()))
    by_set = _config(monkeypatch, tmp_path, "--set", f"{key}={value}")
    assert by_set.method_args == _config(monkeypatch, tmp_path).method_args
    assert by_set.method_args[key] == value
    assert type(by_set.method_args[key]) is type(value)


TINY = ["--epochs", "2", "--pairs-per-epoch", "64", "--batch-size", "32", "--quiet", "--device", "cpu"]


def _run(tmp_path, capsys, *flags: str) -> tuple[int, str]:
    code = pcli.main(["fps", *TINY, "--out", str(tmp_path / "a.ckpt"), *flags])
    return code, capsys.readouterr().err


def test_a_run_resumes_however_its_method_setting_was_spelled(tmp_path, capsys):
    """A run started with ``--set temperature=0.5`` resumes under the recipe that gives 0.5, also from a
    record written before the settings were typed (the text "0.5"); another value is refused, by name."""
    key, value = next(iter(RECIPES[DEFAULT_RECIPE].method_args.items()))
    assert _run(tmp_path, capsys, "--set", f"{key}={value}")[0] == 0
    assert _run(tmp_path, capsys, "--resume") == (0, "")
    record = tmp_path / "a.run" / "config.json"
    saved = json.loads(record.read_text())
    saved["config"]["pretrain"]["method_args"][key] = str(value)  # as runs before the fix recorded it
    record.write_text(json.dumps(saved))
    assert _run(tmp_path, capsys, "--resume") == (0, "")
    code, err = _run(tmp_path, capsys, "--resume", "--set", f"{key}={value * 2}")
    assert code == 2 and f"method_args.{key}: {value!r} there, {value * 2!r} here" in err
