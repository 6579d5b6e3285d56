"""kNN and linear probes of frozen backbones (pretrain.probe), `pretrain --probe` and `analyze probe`."""

from __future__ import annotations

import json
import math
import shutil
import statistics

import pytest
import torch
import torch.nn.functional as F

from analysis.cli import main as analyze
from pretrain.cli import main as pretrain
from pretrain.probe import digits, knn_predict, linear_accuracy, standard_error


def _slow_knn(train_f, train_y, test_f, n_classes, k, temperature):
    """The definition, one test point at a time."""
    out = []
    for f in test_f:
        sims = [(float(f @ g), int(y)) for g, y in zip(train_f, train_y, strict=True)]
        votes = [0.0] * n_classes
        for s, y in sorted(sims, reverse=True)[:k]:
            votes[y] += torch.tensor(s / temperature, dtype=torch.float64).exp().item()
        out.append(max(range(n_classes), key=votes.__getitem__))
    return torch.tensor(out)


def test_knn_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    train_f = F.normalize(torch.randn(60, 5, generator=g, dtype=torch.float64), dim=1)
    test_f = F.normalize(torch.randn(25, 5, generator=g, dtype=torch.float64), dim=1)
    train_y = torch.randint(0, 4, (60,), generator=g)
    for k, t in ((1, 0.1), (7, 0.1), (20, 0.5)):
        assert torch.equal(knn_predict(train_f, train_y, test_f, 4, k, t), _slow_knn(train_f, train_y, test_f,
                                                                                     4, k, t))


def test_linear_probe_separates_separable_features():
    g = torch.Generator().manual_seed(1)
    y = torch.arange(90) % 3
    f = F.one_hot(y, 3).double() * 5 + 0.1 * torch.randn(90, 3, generator=g, dtype=torch.float64)
    assert linear_accuracy(f[:60], y[:60], f[60:], y[60:]) == 1.0


def test_standard_error_is_the_spread_of_accuracies_over_test_draws():
    g = torch.Generator().manual_seed(2)
    for p, n in ((0.27, 509), (0.9, 360), (0.5, 50)):
        accuracies = (torch.rand(20000, n, generator=g, dtype=torch.float64) < p).double().mean(1)
        assert float(accuracies.std()) == pytest.approx(standard_error(p, n), rel=0.03)
    assert standard_error(1.0, 509) == 0 and standard_error(0.27, 509) == pytest.approx(0.0197, abs=1e-4)


def test_digits_is_the_federate_split():
    train_x, train_y, test_x, test_y = digits(32)
    assert train_x.shape == (1437, 32, 32, 3) and test_x.shape == (360, 32, 32, 3)
    assert train_x.dtype == torch.uint8 and sorted(set(test_y.tolist())) == list(range(10))


def test_pretrain_logs_the_probe_and_analyze_probes_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "p.ckpt"
    code = pretrain(["fps", "--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "3",
                     "--pairs-per-epoch", "32", "--batch-size", "16", "--device", "cpu", "--quiet",
                     "--out", str(out), "--probe", "digits", "--probe-every", "2"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "p.run" / "metrics.jsonl").read_text().splitlines()]
    assert [("probe_knn_acc" in r) for r in rows] == [False, True, True]  # every 2 epochs and the last
    assert "probe_init_knn_acc" in rows[0] and all(0 <= r.get("probe_knn_acc", 0) <= 1 for r in rows)
    capsys.readouterr()
    assert analyze(["probe", str(out), "--device", "cpu", "--out", str(tmp_path / "an")]) == 0
    record = json.loads((tmp_path / "an" / "probe.json").read_text())
    (row,) = record["rows"]
    assert row["input_size"] == 16 and row["arch"] == "resnet20"
    assert 0.1 <= row["random_init"]["knn_acc"] <= 1 and 0 <= row["probe"]["linear_acc"] <= 1
    printed = capsys.readouterr().out
    assert "random init" in printed
    # the gain is against the random mean, and the sampling line gives the test set's own error (digits: 360)
    assert row["gain"]["knn_acc"] == pytest.approx(row["probe"]["knn_acc"] - row["random_init"]["knn_acc"])
    assert record["n_test"] == 360 and "on these 360 test images" in printed
    # and the random mean's own error over its 3 inits, std / sqrt(3), from the recorded per-seed rows
    knn = [100 * s["knn_acc"] for s in row["random_init"]["seeds"]]
    se = statistics.stdev(knn) / math.sqrt(3)
    assert len(knn) == 3 and f"standard error over 3 inits (std / sqrt(3)): kNN ±{se:.1f}," in printed


def test_analyze_probe_folds_scores_every_digit_and_refuses_one_fold(tmp_path, capsys):
    out = tmp_path / "p.ckpt"
    assert pretrain(["fps", "--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "1",
                     "--pairs-per-epoch", "32", "--batch-size", "16", "--device", "cpu", "--quiet",
                     "--out", str(out)]) == 0
    capsys.readouterr()
    assert analyze(["probe", str(out), "--device", "cpu", "--seeds", "1", "--folds", "3",
                    "--out", str(tmp_path / "an")]) == 0
    record = json.loads((tmp_path / "an" / "probe.json").read_text())
    printed = capsys.readouterr().out
    assert "standard error over" not in printed  # one random init has no spread to report
    assert "random init (seed 0):" in printed and "± 0.0" not in printed  # named, and no made-up spread
    assert record["folds"] == 3 and record["n_test"] == 1797  # digits' 1,437 train and 360 test images
    assert "over all 1797 train and test images (3-fold cross-validation)" in printed
    (row,) = record["rows"]
    assert 0.1 <= row["probe"]["knn_acc"] <= 1 and 0.1 <= row["random_init"]["knn_acc"] <= 1
    bad = ["probe", str(out), "--device", "cpu", "--folds", "1", "--out", str(tmp_path / "bad")]
    assert analyze(bad) == 2
    err = capsys.readouterr().err
    assert "--folds" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_analyze_budget_draws_probes_and_fedavg_against_pairs_seen(tmp_path, capsys):
    from federated.cli import main as federate

    ckpts = []
    for pairs, seed in ((32, 0), (64, 0), (64, 1)):  # two seeds of the 64-pair budget are averaged
        out = tmp_path / f"b{pairs}-s{seed}.ckpt"
        assert pretrain(["fps", "--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "2",
                         "--pairs-per-epoch", str(pairs // 2), "--batch-size", "16", "--device", "cpu",
                         "--seed", str(seed), "--quiet", "--keep-every", "1", "--out", str(out)]) == 0
        ckpts.append(str(out))
    final = ckpts[0]  # the same weights as its last kept epoch: counted once, a run from either name found
    ckpts[0] = str(tmp_path / "b32-s0.e0002.ckpt")  # a kept epoch finds its run directory too
    ckpts += [final, str(tmp_path / "b64-s0.e0001.ckpt")]  # the 64-pair run after 32 pairs: a second seed
    (tmp_path / "b64-s0.run" / "state.pt").unlink()  # its metrics unverified: said once for its 2 files
    shutil.rmtree(tmp_path / "b64-s1.run")  # a file copied without its run directory: its own signals
    tiny = ["--width", "0.25", "--clients", "3", "--rounds", "1", "--local-epochs", "1", "--device", "cpu",
            "--quiet", "--alpha", "1.0", "--batch-size", "32", "--no-eval-local"]
    for init, seed in ((ckpts[0], 0), (final, 1), ("random", 0)):
        name = f"fl-{'random' if init == 'random' else 'b32'}-{seed}"
        assert federate([*tiny, "--init", init, "--seed", str(seed), "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    runs = [str(tmp_path / n) for n in ("fl-b32-0", "fl-b32-1", "fl-random-0")]
    assert analyze(["budget", *ckpts, "--runs", *runs, "--device", "cpu", "--out", str(tmp_path / "b")]) == 0
    record = json.loads((tmp_path / "b" / "budget.json").read_text())
    assert [p["pairs"] for p in record["points"]] == [32, 64]
    assert len(record["points"][0]["federated"]) == 2 and record["points"][1]["federated"] == []
    assert len(record["random_federated"]) == 1 and (tmp_path / "b" / "budget.png").is_file()
    assert [len(p["checkpoints"]) for p in record["points"]] == [2, 2]
    assert all(len(p["rankme"]) == len(p["knn_acc"]) == len(p["checkpoints"]) for p in record["points"])
    assert 0 < record["points"][1]["z_std"][0] < 1
    last = torch.load(tmp_path / "b64-s1.ckpt", weights_only=False)["signals"]
    assert [m["rankme"] for m in record["points"][1]["checkpoints"] if m["seed"] == 1] == [last["rankme"]]
    printed = capsys.readouterr()
    assert "pairs: kNN" in printed.out and printed.out.count("the study's bar") == 2
    assert set(record["bar"]) == {"knn_acc", "linear_acc"}
    assert all(isinstance(v, list) for v in record["bar"].values())
    assert printed.err.count("holds the same weights as") == 1 and printed.err.count("no state.pt") == 1


def test_effective_rank_matches_the_rankme_definition():
    import numpy as np

    from pretrain.probe import effective_rank

    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(100, 8, generator=gen) * torch.tensor([5.0, 4, 3, 2, 1, 0.5, 0.1, 0.01])
    s = np.linalg.svd(feats.double().numpy(), compute_uv=False)
    p = s / s.sum() + 1e-7
    assert effective_rank(feats) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-9)
    # invariants: one direction -> 1, a flat spectrum -> its dimension, and the scale does not matter
    line = torch.randn(50, 1, generator=gen) @ torch.randn(1, 6, generator=gen)
    assert effective_rank(line) == pytest.approx(1.0, abs=1e-3)
    assert effective_rank(torch.eye(6)) == pytest.approx(6.0, rel=1e-5)
    assert effective_rank(3 * feats) == pytest.approx(effective_rank(feats), rel=1e-9)


def test_falling_rank_needs_steady_and_real_decline():
    from pretrain.rankme import falling

    assert falling([40, 38, 36, 34])
    assert not falling([40, 38, 39, 34])  # not steady
    assert not falling([40, 39.9, 39.8, 39.7])  # less than 5% overall
    assert not falling([40, 38, 36])  # too short to say


def test_pretrain_logs_rankme_every_epoch(tmp_path):
    from pretrain.cli import main

    out = tmp_path / "fps.ckpt"
    main(["fps", "--epochs", "2", "--pairs-per-epoch", "64", "--batch-size", "32", "--device", "cpu",
          "--quiet", "--width", "0.25", "--out", str(out)])
    lines = [json.loads(x) for x in (tmp_path / "fps.run" / "metrics.jsonl").read_text().splitlines()]
    assert "rankme_init" in lines[0]
    assert all(1.0 <= line["rankme"] <= 16 for line in lines)  # width 0.25: 16 features
