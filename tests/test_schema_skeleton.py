"""``ckpt schema``: a skeleton listing every exchange holding in-flight data, loadable as it is."""

from __future__ import annotations

import tomllib

import pytest

from catalog import ALL_FIXTURES, fixture_named

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


def test_candidate_senders_once_each_with_their_figures_and_what_the_bytes_say(ckpt):
    """Without a plan, the senders that could feed slow-count: map-main (the real one) and
    final-filter (downstream of it, holding output state too). Each is listed once with the
    output buffers it holds, and the bytes tell them apart."""
    fixture = next(f for f in CASES if f.name == "flink120-hashmap-p2")
    code, out, err = ckpt("schema", str(fixture.checkpoint))
    assert code == 0, err
    entry = out.split("[[exchange]]")[1]
    candidates = [line for line in entry.splitlines() if line.startswith('#   "')]
    assert len(candidates) == len({c.split(",")[0] for c in candidates}) == 2
    map_main = next(c for c in candidates if "5ff73b99d0669153bf2feac805d152ac" in c)
    final_filter = next(c for c in candidates if "47e93a68ef53ecc062442b69740aa4a1" in c)
    assert "partition 0: 22 output buffers (58105 bytes); the bytes fit" in map_main
    assert "the bytes contradict it" in final_filter
    assert "0 output buffers (0 bytes)" not in out
    # the SQL sink (parallelism 1) cannot be fed by an operator whose output goes to 2 subtasks
    code, out, err = ckpt("schema", str(fixture_named("flink23-sql-p2").checkpoint))
    entries = [e.split("\n\n")[0] for e in out.split("[[exchange]]")]
    sink_entry = next(e for e in entries if 'downstream = "c236b8d78d6f266597f918c317358f20"' in e)
    assert "ceb97c30baba662117f288004a2d42fc" not in sink_entry and "36f592a04529dc1fbcb791b0d166f9f3" in sink_entry
