"""bench/fedavg_gain.py: gains paired by host and FL seed, Spearman's rho and Holm's adjustment on tables
whose answer is known, the committed table readable, and a bad table one line with exit code 2."""

import json
import subprocess
import sys

import pytest

from tests.analysis.bench_scripts import REPO, bench_script


@pytest.fixture(scope="module")
def gain():
    return bench_script("fedavg_gain")


def toy(n: int = 5) -> dict:
    """n files whose gain rises with kNN and linear and falls with layer3 cosine; digits scattered."""
    files = [{"name": f"f{i}", "device": "cpu" if i % 2 else "gpu", "host": "a",
              "fedavg": [30 + i, 31 + i, 32 + i], "layer3_cos": 0.9 - 0.1 * i, "knn": 25 + i,
              "linear": 30 + 2 * i, "digits_knn": 70 + (7 * i) % 5} for i in range(n)]
    return {"random": {"a": [28.0, 29.0, 30.0]}, "files": files}


def test_gain_is_paired_by_seed(gain):
    table = toy(3)
    table["random"]["a"] = [0.0, 10.0, 20.0]
    # file 0: (30 - 0 + 31 - 10 + 32 - 20) / 3 = 21
    assert gain.gains(table)[0] == pytest.approx(21.0)


def test_rank_correlation_signs(gain):
    table = toy(6)
    out = gain.correlations(table, gain.gains(table))
    assert out["files"] == 6
    assert out["knn"]["rho"] == pytest.approx(1.0)
    assert out["linear"]["rho"] == pytest.approx(1.0)
    assert out["layer3_cos"]["rho"] == pytest.approx(-1.0)
    assert abs(out["digits_knn"]["rho"]) < 0.5  # 70, 72, 74, 71, 73, 70
    # files 1, 3, 5: digits 72, 71, 70 as the gain rises
    cpu = gain.correlations(table, gain.gains(table), "cpu")
    assert cpu["files"] == 3 and cpu["digits_knn"]["rho"] == pytest.approx(-1.0)


def test_holm_by_hand(gain):
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert gain.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert gain.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_committed_table_reads():
    table = json.loads((REPO / "docs" / "fedavg-gain.json").read_text())
    assert len(table["files"]) >= 17
    assert all(len(f["fedavg"]) == len(table["random"][f["host"]]) for f in table["files"])


def test_bad_table_one_line_exit_2(tmp_path):
    table = toy(4)
    table["files"][2]["host"] = "nowhere"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "fedavg_gain.py"), str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "nowhere" in done.stderr
    assert "Traceback" not in done.stderr
