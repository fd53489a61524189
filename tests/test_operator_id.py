"""Operators named by uid are found on Flink 1.x too, whose metadata stores no uids: the id is
the hash Flink derives from the uid (StreamGraphHasherV2), checked against every fixture's
operators.json (ids and uids as Flink's StreamGraph reported them)."""

from __future__ import annotations

import json

from catalog import ALL_FIXTURES
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.operator_id import murmur3_128, operator_id_of_uid


def test_uid_hash_equals_flinks_operator_ids():
    pairs = set()
    for fixture in ALL_FIXTURES:
        operators = json.loads((fixture.directory / "operators.json").read_text())
        pairs |= {(o["uid"], o["id"]) for v in operators["vertices"] for o in v["operators"] if o.get("uid")}
    assert len(pairs) >= 20
    for uid, operator_id in pairs:
        assert operator_id_of_uid(uid) == operator_id, uid


def test_murmur3_128_known_values():
    # Guava: Hashing.murmur3_128().hashBytes(...) for "" and a 31-byte input (a full block and a tail)
    assert murmur3_128(b"").hex() == "00000000000000000000000000000000"
    assert len(murmur3_128(b"x" * 31)) == 16 and murmur3_128(b"x" * 31) != murmur3_128(b"x" * 32)


def test_uids_find_operators_in_metadata_without_uids():
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink115-hashmap-p2")
    metadata = Checkpoint.open(str(fixture.checkpoint)).metadata
    assert metadata.version == 3 and all(op.uid is None for op in metadata.operators)
    assert metadata.operator("slow-count").id_hex == "0a6c3d247193df04622ad9b3b66741a5"
    assert metadata.operator("map-main").id_hex == "5ff73b99d0669153bf2feac805d152ac"


def test_a_uid_is_hashed_as_javas_utf8_bytes():
    """Guava hashes ``uid.getBytes(UTF_8)``: a surrogate pair is one character (four bytes), a
    lone surrogate (which Python strings can hold, and the metadata's modified UTF-8 can encode)
    the replacement ``?``. The ids are those Flink 2.3's own (shaded) Guava gives,
    ``Hashing.murmur3_128(0).newHasher().putString(uid, UTF_8).hash()``, run on 2026-11-29."""
    assert operator_id_of_uid("\ud83d\ude00") == operator_id_of_uid("😀") == "5c54e08755b16d15ba04e1cf3f082e29"
    assert operator_id_of_uid("a\ud800b") == operator_id_of_uid("a?b") == "4adb1b0489e6f965793498cfb8922153"
