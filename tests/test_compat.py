"""The Flink 1.20.3 and 2.3.0 rows of the compatibility matrix, every cell (`make compat` runs
every version): the plain fixture of each version, and every fixture that shows a state feature."""

import pytest
from compat_matrix import CHECKS, checks, feature_fixtures, version_fixtures

from catalog import CI_FLINK_VERSIONS

ROWS = [f for f in version_fixtures(["1.20", "2.3"]) if f.info["flink_version"] in CI_FLINK_VERSIONS]
FEATURE_FIXTURES = [f for f in feature_fixtures(["1.20", "2.3"]) if f.info["flink_version"] in CI_FLINK_VERSIONS]
ALL_PASS = dict.fromkeys(CHECKS, True)


def test_every_ci_version_has_a_row():
    assert sorted(f.info["flink_version"] for f in ROWS) == sorted(CI_FLINK_VERSIONS)


@pytest.mark.flink
@pytest.mark.parametrize("row_fixture", ROWS, ids=[f.info["flink_version"] for f in ROWS])
def test_compat_row(row_fixture):
    assert checks(row_fixture) == ALL_PASS


@pytest.mark.flink
@pytest.mark.parametrize("feature_fixture", FEATURE_FIXTURES, ids=[f.name for f in FEATURE_FIXTURES])
def test_compat_feature_cell(feature_fixture):
    assert checks(feature_fixture) == ALL_PASS
