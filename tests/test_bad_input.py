"""Unusable input gives exit code 2 and one clear line for every command, and leaves nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from catalog import ALL_FIXTURES, FIXTURES
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import read_metadata

BASE = next(f for f in ALL_FIXTURES if f.name == "flink120-hashmap-p2")  # channel state in a file


def first_breaking_flip(data: bytes) -> bytes:
    """The metadata with the first byte (after the header) whose flip Flink's format rejects."""
    for position in range(24, len(data)):
        broken = bytearray(data)
        broken[position] ^= 0xFF
        try:
            read_metadata(bytes(broken))
        except CkptError:
            return bytes(broken)
    raise AssertionError("no flip breaks the metadata")


def damage(checkpoint, kind: str) -> None:
    metadata = checkpoint / "_metadata"
    data = metadata.read_bytes()
    if kind == "truncated-metadata":
        metadata.write_bytes(data[: len(data) // 2])
    elif kind == "flipped-byte":
        metadata.write_bytes(first_breaking_flip(data))
    elif kind == "not-a-checkpoint":
        metadata.unlink()
    else:
        channel_file = next(
            u for u in Checkpoint.open(str(checkpoint)).referenced_files() if "/chk-" in u and u.rsplit("/", 1)[1] != "_metadata"
        )
        if kind == "missing-channel-state":
            shutil.os.remove(channel_file)
        else:
            with open(channel_file, "r+b") as f:
                f.truncate(10)


KINDS = ["truncated-metadata", "flipped-byte", "not-a-checkpoint", "missing-channel-state", "truncated-channel-state"]
INPUTS = ["--engine", "local", "--schema", BASE.schema, "--plan", BASE.plan]
COMMANDS = {
    "inspect": lambda src, dst: ["inspect", src],
    "verify": lambda src, dst: ["verify", src, "--engine", "local"],
    "rescale": lambda src, dst: ["rescale", src, dst, "-p", "3", *INPUTS],
    "repair": lambda src, dst: ["repair", src, dst, *INPUTS],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_input(ckpt, tmp_path, command, kind):
    job = tmp_path / "job"
    shutil.copytree(BASE.checkpoint.parent, job)
    checkpoint = job / BASE.checkpoint.name
    damage(checkpoint, kind)
    destination = tmp_path / "out"
    code, out, err = ckpt(*COMMANDS[command](str(checkpoint), str(destination)))
    assert code == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    if command == "verify" and out:  # the report names the damage, status unusable
        assert "unusable" in out
    else:
        assert len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: ")
    assert not destination.exists(), "a failed command left files behind"


def test_avro_schema_that_does_not_match_the_records(ckpt, tmp_path):
    """The records are Tuple2<Long,String>; read as Avro they do not fit: exit 2, naming the
    exchange, the channel and the first record that does not fit."""
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-hashmap-p2")
    (tmp_path / "event.avsc").write_text((FIXTURES / "avro" / "event.avsc").read_text())
    schema = tmp_path / "schema.toml"
    schema.write_text(
        '[[exchange]]\nupstream = "map-main"\ndownstream = "slow-count"\n'
        'type = "avro"\navro_schema = "event.avsc"\nkey = ["id"]\n'
    )
    code, _, err = ckpt("inspect", str(fixture.checkpoint), "--schema", str(schema), "--engine", "local")
    assert code == 2 and "Traceback" not in err
    assert "exchange map-main -> slow-count" in err and "channel 0 -> 0: stream element 0" in err, err
    assert "the Avro schema does not match the record's bytes" in err, err


def test_unknown_record_type_lists_the_supported_ones(ckpt, tmp_path):
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-sql-p2")
    schema = tmp_path / "schema.toml"
    schema.write_text(Path(fixture.schema).read_text().replace("binary_row<", "binary_row<x:decimals(10,2),", 1))
    code, _, err = ckpt("inspect", str(fixture.checkpoint), "--schema", str(schema), "--engine", "local")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "unknown type 'decimals'; supported: DataStream: avro" in err and "decimal(p,s), timestamp(p), timestamp_ltz(p)" in err
