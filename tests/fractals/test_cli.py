"""The ``fractals`` command: bank, preview, bench, and one-line errors with exit code 2."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fractals.cli import main


def test_bank_is_byte_identical_for_a_seed(tmp_path, capsys):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert main(["bank", "--n", "500", "--seed", str(seed), "--out", str(tmp_path / f"{name}.npz")]) == 0
    digest = {n: hashlib.sha256((tmp_path / f"{n}.npz").read_bytes()).hexdigest() for n in "abc"}
    assert digest["a"] == digest["b"] != digest["c"]
    assert "wrote 500 codes" in capsys.readouterr().out


@pytest.mark.parametrize(("kind", "size", "n", "expected"), [
    # zoom 4 (32 px -> 128 px); cells of two views are 2 * 128 + 2 wide; 4 cells a row; 6 px gaps.
    ("fps", 32, 8, (1062, 274)),
    ("single", 32, 3, (3 * 258 + 4 * 6, 128 + 12)),
    ("multilabel", 32, 5, (4 * 128 + 5 * 6, 2 * 128 + 3 * 6)),
    ("fps", 224, 2, (2 * 450 + 3 * 6, 224 + 12)),
])
def test_preview_writes_png_of_expected_size(tmp_path, kind, size, n, expected):
    out = tmp_path / "grid.png"
    argv = ["preview", "--kind", kind, "--size", str(size), "--n", str(n), "--out", str(out)]
    if size == 224:
        bank = tmp_path / "bank.npz"
        assert main(["bank", "--n", "50", "--out", str(bank)]) == 0
        argv += ["--bank", str(bank)]
    assert main(argv) == 0
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == expected
        pixels = np.asarray(img.convert("RGB")).reshape(-1, 3)
        assert len(np.unique(pixels, axis=0)) > 20  # not a blank image


def _single_views(tmp_path, *sets: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The two views of each of 2 cells of ``preview --kind single`` (32 px, zoom 4), read off the PNG."""
    out = tmp_path / "views.png"
    assert main(["preview", "--kind", "single", "--n", "2", "--out", str(out),
                 *[a for s in sets for a in ("--set", s)]]) == 0
    grid = np.asarray(Image.open(out).convert("RGB"))
    cells = []
    for i in range(2):
        left = 6 + i * (2 * 128 + 2 + 6)
        cells.append((grid[6:134, left:left + 128], grid[6:134, left + 130:left + 258]))
    return cells


def test_preview_shows_the_views_that_set_asks_for(tmp_path):
    """``--set`` reaches the views (pretrain's own settings): every random transform off and whole-image
    crops make a fractal's two views one image; the defaults do not (the test can fail both ways)."""
    off = _single_views(tmp_path, "crop_min=1", "jitter_p=0", "grayscale_p=0", "blur_p=0", "flip_p=0")
    assert all(np.array_equal(a, b) for a, b in off)
    assert not any(np.array_equal(a, b) for a, b in _single_views(tmp_path))


def test_bench_json_has_positive_figures(capsys):
    assert main(["bench", "--size", "32", "--pairs", "300", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(record) == {"size", "augs", "workers", "pairs", "seconds", "pairs_per_s", "ns_per_point",
                           "look", "instances"}
    assert record["pairs"] == 300 and record["size"] == 32 and record["workers"] == 1
    assert record["seconds"] > 0 and record["pairs_per_s"] > 0 and record["ns_per_point"] > 0


def test_bench_times_the_chosen_look(capsys):
    assert main(["bench", "--size", "32", "--pairs", "64", "--look", "sparse", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["look"] == "sparse"


def test_bench_times_the_chosen_instances(capsys):
    assert main(["bench", "--size", "32", "--pairs", "64", "--instances", "independent", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["instances"] == "independent"


def test_bench_with_augs(capsys):
    assert main(["bench", "--size", "32", "--pairs", "64", "--augs", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["augs"] is True and record["pairs_per_s"] > 0


@pytest.mark.parametrize("argv", [
    ["preview", "--size", "8"],
    ["preview", "--n", "0"],
    ["preview", "--n", "-3"],
    ["bench", "--size", "15"],
    ["bench", "--pairs", "0"],
    ["bank", "--n", "0", "--out", "x.npz"],
    ["preview", "--kind", "mosaic"],
    ["preview", "--size", "big"],
    ["preview", "--set", "blur=0"],
    ["preview", "--set", "crop_min=0"],
    ["preview", "--set", "crop_min"],
])
def test_bad_input_exits_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fractals: error:") and len(err.splitlines()) == 1


def test_missing_or_malformed_bank(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"junk")
    for path in (tmp_path / "missing.npz", bad):
        assert main(["preview", "--bank", str(path), "--out", str(tmp_path / "p.png")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err
    assert not (tmp_path / "p.png").exists()


def test_console_script_exit_code_and_no_traceback(tmp_path):
    argv = [sys.executable, "-m", "fractals.cli", "bench", "--bank", str(tmp_path / "none.npz")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_help_explains_every_flag(capsys):
    for command in ("bank", "preview", "bench"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        for flag in {"bank": ["--n", "--seed", "--out"], "preview": ["--kind", "--size", "--bank", "--augs"],
                     "bench": ["--augs", "--pairs", "--workers", "--json"]}[command]:
            assert flag in text
