"""``ckpt schema``: a skeleton listing every exchange holding in-flight data, loadable as it is."""

from __future__ import annotations

import tomllib

import pytest

from catalog import ALL_FIXTURES

CASES = [f for f in ALL_FIXTURES if f.name in ("flink23-hashmap-p2", "flink120-hashmap-p2", "flink115-hashmap-p2")]


@pytest.mark.parametrize("case", CASES, ids=[f.name for f in CASES])
@pytest.mark.parametrize("with_plan", [True, False], ids=["plan", "no-plan"])
def test_skeleton_lists_exchanges_and_loads_as_a_schema(ckpt, tmp_path, case, with_plan):
    fixture = case
    plan = ["--plan", str(fixture.directory / "plan.json")] if with_plan else []
    code, out, err = ckpt("schema", str(fixture.checkpoint), *plan)
    assert code == 0, err
    document = tomllib.loads(out)
    entries = document["exchange"]
    keyed = [e for e in entries if e["downstream"] in ("slow-count", "0a6c3d247193df04622ad9b3b66741a5")]
    assert len(keyed) == 1 and keyed[0]["gate"] == 0
    if with_plan:
        assert keyed[0]["partitioner"] == "HASH"
        assert keyed[0]["upstream"] in ("map-main", "5ff73b99d0669153bf2feac805d152ac")
    else:
        assert "candidates" not in out and "operators with output state" in out
    assert "# type = " in out and "uid" in out and "id 0a6c3d247193df04622ad9b3b66741a5" in out
    skeleton = tmp_path / "skeleton.toml"
    skeleton.write_text(out)
    code, _, err = ckpt("inspect", str(fixture.checkpoint), "--schema", str(skeleton), *plan, "--engine", "local", "--json")
    assert code == 0, err
