"""The C heap as a command leaves it (``ckpt_tool.memory``), measured in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckpt_tool.memory import _libc

CHURN = """
import resource, sys
if sys.argv[1] == "kept":
    from ckpt_tool.memory import keep_heap_top
    keep_heap_top()
elif sys.argv[1] == "task":
    from ckpt_tool.memory import reuse_memory
    reuse_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    pieces = [b"x" * (1 << 20) for _ in range(8)]  # 8 MiB a MiB at a time, then freed
    del pieces
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(getattr(_libc(), "mallopt", None) is None or not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_memory_freed_at_the_top_of_the_heap_is_reused_without_being_mapped_again():
    """Without ``keep_heap_top`` glibc gives the top of the heap back at each free, and the kernel
    maps and zeroes those pages again at the next allocation: 800 MiB made and freed a MiB at a
    time cost 22,000 to 200,000 page faults (as the heap lies). With it the pages are reused: about
    2,000."""
    plain, kept = _page_faults("plain"), _page_faults("kept")
    assert plain > 10_000
    assert kept < plain // 5
    assert _page_faults("task") < plain // 5  # an engine task keeps more still


def _resident_kb(path: str) -> int:
    """This process's resident kB of its mappings of ``path`` (/proc/self/smaps)."""
    resident, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" not in fields[0]:  # a mapping's header line
                inside = fields[-1] == path
            elif inside and fields[0] == "Rss:":
                resident += int(fields[1])
    return resident


def _channel_file(directory, elements: list[bytes]):
    """A channel-state file in ``directory`` of one channel holding ``elements`` (each framed by
    its length), in buffers of Flink's default size: its path, and the channel's buffers."""
    from ckpt_tool.flink.channel_state import BufferSource, write_channel_state_file
    from ckpt_tool.storage import io_for

    path = str(directory / "file")
    stream = b"".join(len(element).to_bytes(4, "big") + element for element in elements)
    writer = write_channel_state_file(io_for(str(directory)), path, [(0, stream)])
    return path, BufferSource(path, None, None, list(writer.placements[0].offsets))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_a_stream_read_a_piece_at_a_time_does_not_stay_resident(tmp_path):
    """A channel read a piece at a time (``ChannelPieces``: the 1.5 GB channel of a rescale to
    parallelism 1, scanned, routed or read back) lets go of its file's mapped pages as each piece
    is read: of a 64 MiB file, at most a few pieces' worth stay resident in the process (all of it
    did), and every record is read."""
    from ckpt_tool.engine.tasks import ChannelPieces
    from ckpt_tool.flink.channel_state import ChannelStateReader

    path, source = _channel_file(tmp_path, [bytes(1000)] * 65536)
    with ChannelStateReader() as reader:
        pieces = ChannelPieces(reader, [source])
        elements = sum(len(framed.records.starts) for framed, _ in pieces)
        assert (elements, pieces.trailing) == (65536, 0)
        assert _resident_kb(path) < 16 * 1024, "the file's pages stayed mapped in the process"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_buffers_digested_where_they_lie_do_not_stay_resident(tmp_path, monkeypatch):
    """``verify`` digests large buffers where they lie in the mapped file (replicas are found by
    them), and reading even a buffer's length maps the pages around it: a file of more than
    IN_PLACE_WINDOW_BYTES of buffers is read a window at a time, each window's pages let go, with
    the same digests as read at once (the window made small here)."""
    import numpy as np

    from ckpt_tool.errors import CkptError
    from ckpt_tool.flink import channel_state
    from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader

    path, source = _channel_file(tmp_path, [bytes(998) + i.to_bytes(2, "big") for i in range(65536)])  # every buffer different
    with ChannelStateReader() as reader:
        whole = reader.buffer_digests(source)
        owned = reader.buffer_digests_owned(source, np.zeros(len(source.offsets), dtype=np.int64))
    monkeypatch.setattr(channel_state, "IN_PLACE_WINDOW_BYTES", 4 << 20)
    with ChannelStateReader() as reader:
        assert reader.buffer_digests(source) == whole and len(set(whole)) == len(whole) > 1000
        assert _resident_kb(path) < 16 * 1024, "the file's pages stayed mapped in the process"
        assert reader.buffer_digests_owned(source, np.zeros(len(source.offsets), dtype=np.int64)) == owned
        assert _resident_kb(path) < 16 * 1024
    # a buffer that overlaps the one before, the first of a window, that before the last of the
    # window before: refused as read at once
    inside = source.offsets[0] + (4 << 20)
    assert inside not in source.offsets
    overlapping = BufferSource(path, None, None, sorted(source.offsets + [inside]))
    with ChannelStateReader() as reader:
        with pytest.raises(CkptError, match="repeats or overlaps the buffer before it"):
            reader.buffer_digests(overlapping)
        assert reader.buffer_digests_owned(overlapping, np.zeros(len(overlapping.offsets), dtype=np.int64)) is None
