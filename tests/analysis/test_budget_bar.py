"""Issue 38's bar for a budget study (``analysis.budget.study_bar``): each budget at least the one before
minus the random inits' std, the largest beyond random + 3 points."""

import pytest

from analysis.budget import study_bar

BASE, STD = 0.252, 0.023  # the fair kNN probe's random inits on the CIFAR-10 probe set (docs/budget.md)


def test_a_rising_study_beyond_the_margin_holds():
    assert study_bar([(125_000, 0.25), (250_000, 0.27), (500_000, 0.29)], BASE, STD) == []


def test_a_dip_within_the_std_holds_and_one_beyond_it_fails():
    assert study_bar([(1, 0.30), (2, 0.30 - STD + 1e-9), (3, 0.30)], BASE, STD) == []
    fails = study_bar([(125_000, 0.314), (250_000, 0.265), (375_000, 0.30)], BASE, STD)
    assert len(fails) == 1 and "250,000 pairs fell 4.9 points below 125,000" in fails[0]


def test_the_largest_budget_must_clear_random_plus_three():
    fails = study_bar([(1, 0.27), (2, 0.28)], BASE, STD)  # 28.0 < 28.2
    assert len(fails) == 1 and "below random + 3 (28.2%)" in fails[0]
    assert study_bar([(1, 0.27), (2, 0.283)], BASE, STD) == []
    assert study_bar([(1, 0.27), (2, 0.283)], BASE, STD, margin=0.05) != []


@pytest.mark.parametrize("n", [0, 1])
def test_a_study_of_fewer_than_two_budgets_is_judged_on_its_last(n):
    budgets = [(1, 0.30)][:n]
    assert study_bar(budgets, BASE, STD) == []


def test_the_signal_panels_legend_covers_no_point():
    """RankMe rising and the cosine falling, as in every budget study: no marker of either curve may sit
    under the panel's legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.budget import _legend_over_twins

    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = [125_000 * k for k in range(1, 9)]
    ax.plot(x, [15 + k for k in range(8)], "-o", label="RankMe")
    twin = ax.twinx()
    twin.plot(x, [0.93 - 0.03 * k for k in range(8)], "--s", label="cosine to init")
    ax.set_xscale("log")
    _legend_over_twins(ax, twin)
    fig.canvas.draw()
    box = twin.get_legend().get_window_extent()
    assert len(twin.get_legend().get_texts()) == 2  # one legend names both curves
    for a in (ax, twin):
        for line in a.get_lines():
            for px, py in a.transData.transform(line.get_xydata()):
                assert not box.contains(px, py), (line.get_label(), px, py)
    plt.close(fig)
