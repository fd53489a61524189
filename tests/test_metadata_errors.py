"""Malformed metadata gives errors that name what is wrong and where."""

from __future__ import annotations

import pytest
from java_streams import JavaStream, billion_laughs, checkpoint_properties, real_checkpoint_type

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.metadata import MAX_HANDLE_DEPTH, read_metadata, write_metadata
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    ChangelogBackendHandle,
    ChannelStateHandle,
    CheckpointMetadata,
    KeyGroupsHandle,
    OperatorState,
    SubtaskState,
)


def sample(version: int) -> CheckpointMetadata:
    subtask = SubtaskState(
        0,
        managed_keyed=KeyGroupsHandle(12, 0, [1, 2, 3], ByteStreamHandle("kg", b"abc"), "id-1"),
        input_channels=[ChannelStateHandle("input", 0, (0, 1), [4], 9, ByteStreamHandle("cs", b"\0\0\0\0\0\0\0\1x"))],
    )
    op = OperatorState(bytes(range(16)), 2, 128, "op", "uid", subtasks=[subtask, SubtaskState(1, finished=True)])
    return CheckpointMetadata(version, 7, [], [op], checkpoint_properties() if version >= 4 else None)


def keyed_tag_position(version: int) -> int:
    names = (2 + 2) + (2 + 3) if version >= 5 else 0  # writeUTF("op"), writeUTF("uid")
    return 8 + 8 + 4 + 4 + names + 16 + 4 + 4 + 1 + 4 + 4 + 4 + 4


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_synthetic_round_trip(version):
    data = write_metadata(sample(version))
    assert write_metadata(read_metadata(data)) == data
    assert read_metadata(data).operators[0].subtasks[1].finished


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_unknown_keyed_tag_names_tag_and_position(version):
    data = bytearray(write_metadata(sample(version)))
    position = keyed_tag_position(version)
    assert data[position] == 12
    data[position] = 42
    holder = "operator 000102030405060708090a0b0c0d0e0f" + (' \\(uid "uid", name "op"\\)' if version >= 5 else "")
    with pytest.raises(
        CheckpointFormatError, match=rf"unknown keyed state handle type tag 42 in {holder} subtask 0 at byte {position}$"
    ):
        read_metadata(bytes(data))


def test_unknown_channel_tag_v6():
    data = bytearray(write_metadata(sample(6)))
    position = keyed_tag_position(6) + 1 + 4 + 4 + 3 * 8 + 1 + 2 + 2 + 4 + 3 + 1 + 2 + 4 + 4  # after keyed + raw null
    assert data[position] == 1
    data[position] = 9
    holder = 'operator 000102030405060708090a0b0c0d0e0f \\(uid "uid", name "op"\\) subtask 0'
    message = rf"unknown input channel state handle type tag 9 in {holder} at byte {position}$"
    with pytest.raises(CheckpointFormatError, match=message):
        read_metadata(bytes(data))


def test_every_truncation_is_a_clean_error():
    data = write_metadata(sample(6))
    for cut in range(len(data) - 1):
        with pytest.raises(CheckpointFormatError):
            read_metadata(data[:cut])


# --- checkpoint properties, trailing bytes and nesting (issue 26) --------------------------------


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_trailing_bytes_are_refused(version):
    """Flink's loader would leave them unread, but its writer never writes any: refused."""
    data = write_metadata(sample(version)) + b"\0" * 5
    after = "the checkpoint properties" if version >= 4 else "the operator states"
    with pytest.raises(CheckpointFormatError, match=rf"_metadata: 5 trailing bytes after {after} at byte {len(data) - 5}$"):
        read_metadata(data)


def test_missing_properties_are_refused():
    data = write_metadata(sample(6))
    with pytest.raises(CheckpointFormatError, match="missing checkpoint properties"):
        read_metadata(data[: -len(checkpoint_properties())])


def with_properties(properties: bytes) -> bytes:
    metadata = sample(6)
    metadata.properties = properties
    return write_metadata(metadata)


def laughs_stream(levels: int) -> bytes:
    return checkpoint_properties(lambda s: real_checkpoint_type(s, lambda: billion_laughs(s, levels)))


def string_stream(text: str) -> bytes:
    s = JavaStream()
    s.string(text)
    return s.getvalue()


def null_stream() -> bytes:
    s = JavaStream()
    s.null()
    return s.getvalue()


def self_cycle(s: JavaStream) -> None:
    s.ref(0x7E0000 + 2)  # 0: the class description, 1: its field type string, 2: the properties


def name_cycle(s: JavaStream) -> None:
    real_checkpoint_type(s, lambda: s.ref(0x7E0000 + s.handles - 1))  # the CheckpointType's own handle


def deep_chain(s: JavaStream, levels: int) -> None:
    """``levels`` objects ``Box{inner}``, each the ``inner`` of the one before (written in a loop:
    the stream is deeper than Python's recursion limit)."""
    s.out.append(0x73)
    desc = s.class_desc("Box", [("L", "inner", "Ljava/lang/Object;")])
    s.new_handle()
    for _ in range(levels - 1):
        s.out.append(0x73)
        s.ref(desc)
        s.new_handle()
    s.null()


MANY_FIELDS = [("L", f"x{i}", "Ljava/lang/Object;") for i in range(1100)]


def many_strings(s: JavaStream, _: int) -> None:
    for i in range(1100):
        s.string(f"s{i}")


@pytest.mark.parametrize(
    "properties, message",
    [
        (string_stream("hello"), 'checkpoint properties are a String "hello", not a org.apache.flink.runtime.checkpoint.Check'),
        (null_stream(), "checkpoint properties are null, not a"),
        (checkpoint_properties(lambda s: s.string("Checkpoint")), 'checkpointType is a String "Checkpoint", not a SnapshotType'),
        (checkpoint_properties(lambda s: s.null()), "checkpointType is null, not a SnapshotType object"),
        (checkpoint_properties(self_cycle), r"back-reference 0x7e0002 into an object that is still being read \(a cycle\)"),
        (checkpoint_properties(name_cycle), r"into an object that is still being read \(a cycle\)"),
        (checkpoint_properties(lambda s: s.ref(0x7E0000 + 40)), "back-reference 0x7e0028 to no object read before it"),
        (laughs_stream(25), r"an object of class Lol expands to more than 262144 values \(ckpt's limit\)"),
        (laughs_stream(40), r"objects nested more than 32 deep \(ckpt's limit\)"),
        (laughs_stream(10), "checkpointType.name is an object of class Lol, not a String"),
        (checkpoint_properties(lambda s: deep_chain(s, 5000)), r"objects nested more than 32 deep \(ckpt's limit\)"),
        (
            checkpoint_properties(extra_fields=MANY_FIELDS, extra_values=many_strings),
            r"more than 1024 objects \(ckpt's limit\)",
        ),
        (checkpoint_properties(lambda s: s.out.append(0x75)), r"an array \(type code 0x75\), which CheckpointProperties never"),
        (checkpoint_properties(lambda s: s.class_desc("X", [])), "field checkpointType holds a class description"),
        (b"\xac\xed\x00\x04p", "checkpoint properties are not a Java serialization stream"),
    ],
    ids=[
        "string", "null", "string-type", "null-type", "cycle", "name-cycle", "dangling", "laughs", "laughs-deep",
        "laughs-as-name", "deep-chain", "many-handles", "array", "class-desc-value", "stream-version",
    ],
)  # fmt: skip
def test_hostile_properties_are_refused(properties, message):
    with pytest.raises(CheckpointFormatError, match=message):
        read_metadata(with_properties(properties))


def test_shared_values_stay_shared():
    """A back-reference is the same Python object, not a copy (nothing is expanded)."""
    from ckpt_tool.flink.javaser import read_java_object

    value = read_java_object(laughs_stream(12))["checkpointType"]["name"]
    assert value["a"] is value["b"] and value["a"]["a"] is value["a"]["b"]


def nested_key_groups(levels: int) -> KeyGroupsHandle:
    handle = KeyGroupsHandle(3, 0, [], ByteStreamHandle("kg", b"abc"))
    for _ in range(levels - 1):
        handle = KeyGroupsHandle(3, 0, [], handle)
    return handle


def nested_changelog(levels: int) -> ChangelogBackendHandle:
    handle = ChangelogBackendHandle(14, 0, 128, 0, [], [], 1, 1, "id")
    for _ in range(levels - 1):
        handle = ChangelogBackendHandle(14, 0, 128, 0, [handle], [], 1, 1, "id")
    return handle


@pytest.mark.parametrize("kind", ["key-groups", "changelog"])
@pytest.mark.parametrize("levels, refused", [(MAX_HANDLE_DEPTH, False), (MAX_HANDLE_DEPTH + 1, True)])
def test_nested_handles_are_bounded(kind, levels, refused):
    metadata = sample(6)
    subtask = metadata.operators[0].subtasks[0]
    if kind == "key-groups":
        subtask.managed_keyed.delegate = nested_key_groups(levels)
    else:
        subtask.managed_keyed = nested_changelog(levels + 1)  # the outermost is not nested in another
    data = write_metadata(metadata)
    if not refused:
        assert write_metadata(read_metadata(data)) == data
        return
    message = rf"handles nested more than {MAX_HANDLE_DEPTH} deep in operator .* subtask 0"
    with pytest.raises(CheckpointFormatError, match=message):
        read_metadata(data)


def test_thousands_of_nested_handles_are_refused_without_recursing():
    data = write_metadata(sample(6))
    marker = write_metadata_handle(ByteStreamHandle("kg", b"abc"))
    at = data.index(marker)
    deep = b"\x03\0\0\0\0\0\0\0\0" * 5000  # KEY_GROUPS, start 0, no offsets, then its delegate
    with pytest.raises(CheckpointFormatError, match="handles nested more than"):
        read_metadata(data[:at] + deep + data[at:])


def write_metadata_handle(handle) -> bytes:
    from ckpt_tool.flink.javaio import JavaWriter
    from ckpt_tool.flink.metadata import _MetadataWriter

    writer = _MetadataWriter(JavaWriter(), 6)
    writer.stream_handle(handle)
    return writer.w.getvalue()
