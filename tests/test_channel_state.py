"""The one channel-state reader and writer, record framing across buffers, and pointwise links."""

import os
import struct

import pytest

from ckpt_tool.errors import CheckpointFormatError, StorageError
from ckpt_tool.flink.channel_state import (
    HEADER,
    WRITE_BUFFERS,
    BufferSource,
    ChannelStateReader,
    ChannelStateWriter,
    Pieces,
    pointwise_channels,
    small_channels_file,
    write_channel_state_file,
)
from ckpt_tool.records.batch import frame_channel
from ckpt_tool.storage.local import LocalFileIO


def frame(*records: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(r)) + r for r in records)


def elements(stream: bytes) -> list[bytes]:
    records = frame_channel(stream)
    return [records.element(i) for i in range(len(records.tags))]


def test_records_spanning_buffers_and_length_fields():
    stream = frame(b"\x01a" * 5, b"\x01b", b"\x01" + b"c" * 300)
    # the stream is whatever the buffers hold, cut anywhere, even inside length fields
    for cut in range(len(stream) + 1):
        assert elements(stream[:cut] + stream[cut:]) == [b"\x01a" * 5, b"\x01b", b"\x01" + b"c" * 300]


def test_partial_record_is_reported_as_trailing():
    stream = frame(b"\x01one", b"\x01two")
    records = frame_channel(stream[:-1])
    assert len(records.tags) == 1 and records.trailing == len(stream) - 1 - 8


def test_writer_cuts_network_buffers_and_places_them(tmp_path):
    uri = str(tmp_path / "channel-state")
    pieces = [(0, b"x" * 5), (1, b"y" * 3), (0, b"z" * 4)]
    writer = write_channel_state_file(LocalFileIO(), uri, pieces, buffer_size=4)
    data = (tmp_path / "channel-state").read_bytes()
    assert data[:4] == HEADER and writer.size == len(data)
    # target 0: "xxxx" at once, then "xzzz"; at the end, in target order, its "z", then target 1's "yyy"
    assert writer.placements[0].offsets == [4, 12, 20] and writer.placements[1].offsets == [25]
    assert writer.placements[0].size == 8 + 8 + 5 and writer.placements[1].size == 7
    reader = ChannelStateReader()
    assert reader.payload(BufferSource(uri, None, None, writer.placements[0].offsets)) == b"xxxxxzzzz"
    assert reader.buffers(BufferSource(uri, None, None, writer.placements[1].offsets)) == [b"yyy"]
    reader.close()


def test_writer_streams_in_buffers_of_the_given_size():
    writer = ChannelStateWriter(buffer_size=3)
    chunks = list(writer.start()) + list(writer.add(7, b"abcdefg")) + list(writer.finish())
    assert b"".join(bytes(c) for c in chunks) == HEADER + frame(b"abc", b"def", b"g")


def test_a_large_stream_is_written_a_few_buffers_at_a_time_as_whole():
    """A stream of many full buffers (a rescale to parallelism 1 routes all the records into one
    channel) is framed WRITE_BUFFERS buffers at a time, not copied whole: the same bytes, the same
    placements."""
    stream = bytes(range(256)) * 40  # 10,240 bytes: 2,560 buffers of 4, in 10 pieces
    writer = ChannelStateWriter(buffer_size=4)
    chunks = list(writer.start()) + list(writer.add(3, b"ab")) + list(writer.add(3, stream)) + list(writer.finish())
    whole = b"ab" + stream
    assert len(chunks) == 2 + -(-(len(whole) // 4) // WRITE_BUFFERS)  # the header, the pieces, the last buffer
    buffers = [whole[i : i + 4] for i in range(0, len(whole), 4)]
    assert b"".join(bytes(c) for c in chunks) == HEADER + frame(*buffers)
    assert writer.placements[3].offsets == list(range(len(HEADER), len(HEADER) + 8 * len(buffers) - 2, 8))
    assert writer.placements[3].size == 8 * len(buffers) - 2


def test_reader_refuses_what_flink_never_writes(tmp_path):
    data = HEADER + frame(b"abc", b"", b"defg")
    reader = ChannelStateReader()
    assert reader.payload(BufferSource(None, data, None, [4, 11, 15])) == b"abcdefg"
    for offsets, message in [
        ([40], "offset 40 is outside the file"),
        ([15, 4], "repeats or overlaps"),
        ([4, 4], "repeats or overlaps"),
        ([4, 6], "repeats or overlaps"),
        ([2], "inside the file header"),
    ]:
        with pytest.raises(CheckpointFormatError, match=message):
            reader.payload(BufferSource(None, data, None, offsets))
    with pytest.raises(CheckpointFormatError, match="runs past the end"):
        reader.payload(BufferSource(None, data[:-1], None, [15]))
    with pytest.raises(CheckpointFormatError, match="bad header"):
        reader.payload(BufferSource(None, b"\x00\x00\x00\x01" + data[4:], None, [4]))
    (tmp_path / "segments").write_bytes(data)
    with pytest.raises(CheckpointFormatError, match="segment of 1000000000 bytes at 0 is outside the file"):
        reader.payload(BufferSource(str(tmp_path / "segments"), None, (0, 10**9), [4]))
    reader.close()


@pytest.mark.parametrize("up, down", [(2, 2), (2, 5), (5, 2), (3, 7), (7, 3), (1, 4), (4, 1)])
def test_pointwise_links_cover_each_subtask_once(up, down):
    links = pointwise_channels(up, down)
    assert {u for u, *_ in links} == set(range(up)) and {d for _, d, *_ in links} == set(range(down))
    assert len({(d, c) for _, d, c, _ in links}) == len(links) == len({(u, s) for u, _, _, s in links})
    if up <= down:  # one upstream subtask feeds a contiguous range of consumers through subpartitions 0..
        assert all(c == 0 for _, _, c, _ in links)
    else:
        assert all(s == 0 for *_, s in links)


def test_a_reader_keeps_a_bounded_number_of_files_mapped(tmp_path, monkeypatch):
    """Each mapped file holds a descriptor: a task that reads more files than MAX_OPEN_MAPS (a
    route task at parallelism 1,024 reads a thousand) still runs under `ulimit -n 1024`."""
    from ckpt_tool.flink import channel_state
    from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader, write_channel_state_file
    from ckpt_tool.storage import io_for

    monkeypatch.setattr(channel_state, "MAX_OPEN_MAPS", 4)
    sources = []
    for number in range(10):
        uri = str(tmp_path / f"f{number}")
        writer = write_channel_state_file(io_for(uri), uri, [(0, bytes([number]) * 10)])
        sources.append(BufferSource(uri, None, None, writer.placements[0].offsets))
    with ChannelStateReader() as reader:
        for number, source in enumerate(sources * 2):
            assert reader.payload(source) == bytes([number % 10]) * 10
            assert len(reader._mapped) <= 4


def test_small_channels_are_made_at_once_as_the_writer_streams_them(tmp_path):
    """Where no target fills a buffer, ``small_channels_file`` makes the file the streaming writer
    writes (the same bytes and placements; an empty piece still places its target); where one
    does, it leaves the file to the writer."""
    import random

    rng = random.Random(7)
    for case in range(40):
        targets = rng.sample(range(500), rng.randint(1, 60))
        pieces = [(rng.choice(targets), bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))) for _ in range(200)]
        uri = str(tmp_path / f"file-{case}")
        writer = write_channel_state_file(LocalFileIO(), uri, pieces, buffer_size=4096)
        made = small_channels_file(Pieces.of([(t, d, 1) for t, d in pieces]), buffer_size=4096)
        assert made is not None
        assert made.data == (tmp_path / f"file-{case}").read_bytes()
        placements = {
            t: ([o] if o >= 0 else [], z) for t, o, z in zip(made.targets.tolist(), made.offsets.tolist(), made.sizes.tolist())
        }
        assert placements == {t: (p.offsets, p.size) for t, p in writer.placements.items()}
        assert {t: bytes(stream) for t, stream in zip(made.targets.tolist(), made.streams())} == {
            t: b"".join(d for u, d in pieces if u == t) for t in placements
        }
        assert made.records.tolist() == [sum(1 for u, _ in pieces if u == t) for t in made.targets.tolist()]
        assert list(Pieces.of([(t, d, 1) for t, d in pieces])) == [(t, d, 1) for t, d in pieces]
    assert small_channels_file(Pieces.of([(1, b"x" * 10, 1), (2, b"y" * 3, 1), (1, b"z" * 6, 1)]), buffer_size=16) is None
    none = small_channels_file(Pieces.of([]), buffer_size=16)
    assert none is not None and none.data == (tmp_path / "file-0").read_bytes()[:4] and not len(none.targets)


def test_pieces_by_target_hold_each_targets_bytes_in_order_and_write_the_same_channels(tmp_path):
    """``Pieces.by_target`` (what a route task that streams its file hands the writer: a rescale
    of p=4,096 to 64 routes 16.8 million one-record pieces): one piece per target, targets
    ascending, each holding its pieces' bytes in the order they came and their records summed;
    views of the same bytes where the pieces came by target. Written, each channel's bytes and
    records are the ones the pieces give, piece by piece."""
    import random

    rng = random.Random(11)
    for case in range(60):
        targets = rng.sample(range(300), rng.randint(1, 12))
        pieces = [
            (rng.choice(targets), bytes(rng.randrange(256) for _ in range(rng.randint(0, 30))), rng.randint(0, 3))
            for _ in range(rng.randint(0, 80))
        ]
        if case % 2:  # as route_together gives them for a rescale down: by target already
            pieces.sort(key=lambda piece: piece[0])
        joined = Pieces.of(pieces).by_target()
        wanted = sorted({t for t, _, _ in pieces})
        assert joined.targets.tolist() == wanted
        assert [(t, bytes(d), n) for t, d, n in joined] == [
            (t, b"".join(d for u, d, _ in pieces if u == t), sum(n for u, _, n in pieces if u == t)) for t in wanted
        ]
        uri = str(tmp_path / f"file-{case}")
        writer = write_channel_state_file(LocalFileIO(), uri, [(t, d) for t, d, _ in joined], buffer_size=64)
        data = (tmp_path / f"file-{case}").read_bytes()
        for t in wanted:
            placed = writer.placements[t]
            stream = b"".join(data[o + 4 : o + 4 + int.from_bytes(data[o : o + 4], "big")] for o in placed.offsets)
            assert stream == b"".join(d for u, d, _ in pieces if u == t)
    sorted_pieces = Pieces.of([(1, b"ab", 1), (1, b"c", 1), (4, b"de", 2)])
    assert sorted_pieces.by_target().data is sorted_pieces.data  # no copy: views of the routed bytes


def test_a_span_of_buffers_reads_as_the_mapped_file_gives_it(tmp_path):
    """A route task at p=4,096 reads a few kB of each of 4,096 files: without lengths, a local
    file's buffers are read as one span into memory (not mapped). Every result equals the mapped
    read's; what does not read cleanly as a span (a truncated file, a bad header, a buffer running
    past the span) takes the mapped path, which says what is wrong in its words."""
    from ckpt_tool.flink import channel_state

    buffers = [b"a" * 10, b"b" * 3, b"", b"c" * (channel_state.SPAN_SLACK + 500), b"d" * 7]
    data = HEADER + frame(*buffers)
    offsets, at = [], len(HEADER)
    for buffer in buffers:
        offsets.append(at)
        at += 4 + len(buffer)
    path = tmp_path / "state"
    path.write_bytes(data)
    uri = str(path)

    def both(offsets: list[int], counts: list[int], file: str = uri):
        import numpy as np

        with ChannelStateReader() as reader:
            try:
                span = reader.grouped_payloads(BufferSource(file, None, None, offsets), np.array(counts), lengths=False)
                spanned = not reader._mapped
            except CheckpointFormatError as exc:
                span, spanned = str(exc), False
        with ChannelStateReader() as reader:
            try:
                mapped = reader.grouped_payloads(BufferSource(file, None, None, offsets), np.array(counts))
            except CheckpointFormatError as exc:
                mapped = str(exc)
        if isinstance(mapped, str):
            assert span == mapped
        else:
            assert (span[0], span[1].tolist()) == (mapped[0], mapped[1].tolist())
        return spanned

    assert both(offsets, [5])
    assert both(offsets[:2] + offsets[4:], [2, 1])  # the large buffer's span is not read
    assert both(offsets[1:4], [1, 2])  # the last buffer larger than the page read past it: the rest read on
    assert both([offsets[3], offsets[1]], [1, 1])  # handles on their own: a later one may come first
    assert not both([offsets[4], offsets[3]], [2])  # out of order within a handle: the mapped path's error
    path.with_name("short").write_bytes(data[:-1])
    assert not both(offsets, [5], str(path.with_name("short")))  # "runs past the end", as mapped
    path.with_name("header").write_bytes(b"\x00\x00\x00\x01" + data[4:])
    assert not both(offsets[:1], [1], str(path.with_name("header")))  # "bad header", as mapped
    large = HEADER + frame(b"x" * 10, b"y" * (2 * channel_state.SPAN_LIMIT + 10), b"z")
    path.with_name("large").write_bytes(large)
    assert not both([4, 18, 18 + 4 + 2 * channel_state.SPAN_LIMIT + 10], [3], str(path.with_name("large")))
    # buffers far apart are read as runs (not the span between them), as the mapped read gives them
    gap = b"g" * (channel_state.SPAN_GAP + 1)
    runs = [b"p" * 5, b"q" * 2, gap, b"r" * 3, gap, b"s" * 4]
    at, starts = len(HEADER), []
    for buffer in runs:
        starts.append(at)
        at += 4 + len(buffer)
    path.with_name("runs").write_bytes(HEADER + frame(*runs))
    far = [starts[0], starts[1], starts[3], starts[5]]
    assert both(far, [2, 1, 1], str(path.with_name("runs")))
    assert both([far[3], far[0], far[2]], [1, 1, 1], str(path.with_name("runs")))
    # a buffer whose length runs past the end of its run (into bytes no run read): the mapped path
    overlapping = bytearray(HEADER + frame(*runs))
    overlapping[starts[0] : starts[0] + 4] = (channel_state.SPAN_SLACK + 100).to_bytes(4, "big")  # into the gap
    path.with_name("overlapping").write_bytes(bytes(overlapping))
    assert not both([starts[0], starts[1], starts[3]], [1, 2], str(path.with_name("overlapping")))
    with pytest.raises(StorageError, match="cannot read"):
        both(offsets, [5], str(tmp_path / "missing"))
    # the header is read once per process for a file as it is; a file changed in place since is read again
    assert both(offsets[1:2], [1])
    path.write_bytes(b"\x00\x00\x00\x01" + data[4:])
    os.utime(path, ns=(1, 1))  # however coarse the clock, another modification time
    assert not both(offsets[1:2], [1])  # "bad header", as mapped


def test_payloads_read_file_by_file_come_back_in_the_order_of_their_sources():
    """``in_order``: sources grouped by file in any order (or already in order, as a scan by
    downstream subtask meets them: then joined as read) give each source's payload in its place."""
    import numpy as np

    from ckpt_tool.flink.channel_state import in_order

    random = np.random.default_rng(28)
    for case in range(200):
        count = int(random.integers(1, 30))
        payloads = [bytes(random.integers(0, 256, int(random.integers(0, 5)), dtype=np.uint8)) for _ in range(count)]
        files = np.sort(random.integers(0, 4, count)) if case % 2 else random.integers(0, 4, count)
        blobs = []
        for file in dict.fromkeys(files.tolist()):
            members = np.flatnonzero(files == file)
            blobs.append((members, b"".join(payloads[i] for i in members)))
        sizes = np.array([len(p) for p in payloads], dtype=np.int64)
        assert in_order(blobs, sizes) == b"".join(payloads), case
        assert blobs == []
