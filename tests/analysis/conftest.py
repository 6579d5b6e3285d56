"""Fixtures shared by the tests of issue 38's bench diagnostics (bench/crop_knn.py, bench/flip_knn.py)."""

import pytest

from tests.analysis.bench_scripts import digits_subset


@pytest.fixture(scope="module")
def small_digits():
    """The diagnostics' digits subset over 3 folds (every image scored once), as ``--folds`` runs them.

    tests/analysis/test_stage_knn.py overrides it with the plain split."""
    return digits_subset(folds=3)
