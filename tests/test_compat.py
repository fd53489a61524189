"""The Flink 1.20 and 2.3 rows of the compatibility matrix (`make compat` runs them all)."""

import pytest
from compat_matrix import compat_row, version_fixtures

ROWS = version_fixtures(["1.20", "2.3"])


@pytest.mark.flink
@pytest.mark.parametrize("row_fixture", ROWS, ids=[f.info["flink_version"] for f in ROWS])
def test_compat_row(row_fixture):
    assert len(ROWS) == 2
    assert compat_row(row_fixture) == {"read": True, "round trip": True, "rescale restore": True, "repair restore": True}
