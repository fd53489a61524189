"""Hostile file systems, round two (issue #26): runs whose destinations nest, links planted in a
destination or swapped into a source while a run goes, FIFOs and devices where files belong, and
hostile lock files. Every case asserts the exit code, the one-line message, that nothing was
written outside DST and that nothing of another run was deleted.

Runs that must be killed, stopped or raced are the installed ``ckpt`` in a session of their own;
a swap after ckpt checked a source is done between opening a session and running the operation
on it (in-process), and the check on the open descriptor is raced directly.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from measured import run_measured

from catalog import ROOT, fixture_named
from ckpt_tool.errors import StorageError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.ops.rescale import rescale
from ckpt_tool.session import Session
from ckpt_tool.storage.local import LocalFileIO
from ckpt_tool.writer.claim import LOCK_FILE, take_claim

BASE = fixture_named("flink120-hashmap-p2")  # relative handles, channel state in one file
ROCKSDB = fixture_named("flink23-rocksdb-p2")  # incremental RocksDB: SSTs in the job's shared/
CKPT = Path(sys.executable).parent / "ckpt"
INPUTS = ["--plan", BASE.plan, "--schema", BASE.schema]


def one_line_error(code: int, err: str, expected: str, exit_code: int = 2) -> None:
    assert code == exit_code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: "), err
    assert expected in err, err


def tree(directory: Path) -> dict[str, object]:
    """Every entry below ``directory``: a file's bytes, a link's target (never followed)."""
    found: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_symlink():
            found[name] = "-> " + os.readlink(path)
        elif path.is_file():  # a huge (sparse) file by its size and time
            info = path.stat()
            found[name] = path.read_bytes() if info.st_size < 1 << 24 else (info.st_size, info.st_mtime_ns)
        elif not path.is_dir():
            found[name] = stat.S_IFMT(path.lstat().st_mode)
    return found


def files_in(directory: Path) -> dict[str, bytes]:
    """The files directly in ``directory`` and their bytes (a checkpoint's own files)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file() and not p.is_symlink()}


def ckpt_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-")) if directory.is_dir() else []


def channel_files(checkpoint: Checkpoint) -> set[str]:
    """The channel-state files a checkpoint's input channels are in."""
    handles = (h for op in checkpoint.metadata.operators for s in op.subtasks for h in s.input_channels)
    return {location for location in (checkpoint.location(h.delegate) for h in handles) if location is not None}


def copy_job(tmp_path: Path, fixture=BASE) -> Path:
    """A copy of a fixture's job directory; returns its checkpoint directory."""
    shutil.copytree(fixture.checkpoint.parent, tmp_path / "job")
    return tmp_path / "job" / fixture.checkpoint.name


def rescale_base(destination: Path, parallelism: int = 3, source: Path = BASE.checkpoint) -> subprocess.CompletedProcess:
    args = [str(CKPT), "rescale", str(source), str(destination), "-p", str(parallelism), *INPUTS, "--engine", "local"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def verify(checkpoint: Path, inputs: list[str]) -> int:
    run = subprocess.run([str(CKPT), "verify", str(checkpoint), *inputs, "--engine", "local"], capture_output=True, timeout=300)
    return run.returncode


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> tuple[Path, list[str]]:
    """A generated checkpoint of 60 MB of channel state (the bench's generator, proven by a Flink
    restore in test_bench_generator), whose rescale lasts long enough to act on it midway."""
    sys.path.insert(0, str(ROOT / "bench"))
    from generate import FIXTURE, SCHEMA, generate

    source = tmp_path_factory.mktemp("large") / "job" / "chk-3"
    generate(source, 4, 60_000_000)
    return source, ["--plan", str(FIXTURE / "plan.json"), "--schema", str(SCHEMA)]


def large_args(large, destination: Path) -> list[str]:
    source, inputs = large
    return [str(CKPT), "rescale", str(source), str(destination), "-p", "3", *inputs, "--engine", "local", "--json"]


def start(args: list[str], until: Callable[[], bool]) -> subprocess.Popen:
    """Start a run in a session of its own; return it once ``until()`` holds (or it ended)."""
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not until() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    return run


def _lock_holds_record(destination: Path) -> bool:
    try:
        return (destination / LOCK_FILE).stat().st_size > 0
    except FileNotFoundError:
        return False


def start_and_catch_writing(large, destination: Path, catch: Callable[[subprocess.Popen], None]) -> subprocess.Popen:
    """A large rescale into ``destination``, caught by ``catch`` (kill, stop) once it has written
    a data file and before it wrote ``_metadata``; tried a few times on a loaded machine."""
    for _ in range(6):
        shutil.rmtree(destination, ignore_errors=True)
        run = start(large_args(large, destination), lambda: bool(ckpt_files(destination)))
        catch(run)
        if not (destination / "_metadata").exists() and ckpt_files(destination):
            return run
        os.killpg(run.pid, signal.SIGCONT)
        run.communicate(timeout=300)
    pytest.fail("every run finished before it could be caught writing")


# --- cleanup and take-over touch only what this run created (defect 2) ---------------------------

NESTINGS = [("out", "out/sub"), ("out/sub", "out")]  # (the run that dies or fails, the one that finishes)


@pytest.mark.parametrize("dying, finishing", NESTINGS)
def test_a_killed_run_and_its_rerun_leave_a_nested_checkpoint_alone(tmp_path, large, dying, finishing):
    """Run A into one directory is killed (``kill -9`` of its process group) after it wrote data
    files; run B then writes a complete checkpoint into a directory inside A's (or around it).
    A's rerun removes exactly A's files, succeeds, and B's checkpoint stays whole and sound."""
    a_dst, b_dst = tmp_path / dying, tmp_path / finishing

    def kill(run: subprocess.Popen) -> None:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate(timeout=60)

    start_and_catch_writing(large, a_dst, kill)
    left = ckpt_files(a_dst)
    b = rescale_base(b_dst)
    assert b.returncode == 0, b.stderr
    b_files = files_in(b_dst)
    assert "_metadata" in b_files and any(name.startswith("ckpt-") for name in b_files)

    rerun = subprocess.run(large_args(large, a_dst), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["leftovers_removed"] == len(left) > 0
    assert files_in(b_dst) == b_files
    assert verify(b_dst, INPUTS) == 0 and verify(a_dst, large[1]) == 0
    assert not (a_dst / LOCK_FILE).exists() and not (b_dst / LOCK_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing written elsewhere


@pytest.mark.parametrize("dying, finishing", NESTINGS)
def test_a_failing_run_leaves_a_nested_checkpoint_alone(tmp_path, large, dying, finishing):
    """Run A is stopped after it wrote data files; run B writes a complete checkpoint into a
    directory inside A's (or around it); then A is interrupted and cleans up: it removes its own
    files, lock and the directory it made, and nothing of B."""
    a_dst, b_dst = tmp_path / dying, tmp_path / finishing
    a = start_and_catch_writing(large, a_dst, lambda run: os.killpg(run.pid, signal.SIGSTOP))
    try:
        b = rescale_base(b_dst)
        assert b.returncode == 0, b.stderr
        b_files = files_in(b_dst)
        os.kill(a.pid, signal.SIGINT)  # pending until the run goes on
        os.killpg(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=300)
    finally:  # a stopped run A is never left behind, whatever failed above
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
            a.communicate()
    assert a.returncode == 1 and err.strip() == "ckpt: aborted", err
    assert files_in(b_dst) == b_files and verify(b_dst, INPUTS) == 0
    if dying == "out":  # A's destination holds B's directory and nothing else
        assert [p.name for p in a_dst.iterdir()] == ["sub"]
    else:  # A made out/sub: it is gone; out is B's
        assert not a_dst.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing written elsewhere


def test_a_run_failing_beside_a_finished_nested_checkpoint_leaves_it_alone(tmp_path):
    """B's complete checkpoint is in out/sub/ before run A into out/ starts and fails on a
    truncated channel-state file: A says why, and removes nothing of B."""
    from test_hostile import rewrite_metadata

    b_dst = tmp_path / "out" / "sub"
    assert rescale_base(b_dst).returncode == 0
    b_files = files_in(b_dst)
    checkpoint = copy_job(tmp_path)
    name = rewrite_metadata(checkpoint, lambda h: None)
    with open(checkpoint / name, "r+b") as f:  # the last record of the file, cut short
        f.truncate(os.path.getsize(checkpoint / name) - 10)
    rewrite_metadata(checkpoint, lambda h: setattr(h, "size", os.path.getsize(checkpoint / name)))
    failed = rescale_base(tmp_path / "out", source=checkpoint)
    assert failed.returncode == 2 and "holds" not in failed.stderr, failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and "Traceback" not in failed.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["sub"]
    assert files_in(b_dst) == b_files and verify(b_dst, INPUTS) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "out"]


def test_a_dead_runs_journal_is_all_a_rerun_removes(ckpt, tmp_path):
    """The lock of a dead run is untrusted: its rerun removes the journaled names that are
    files directly in DST, never a path that leads elsewhere; other ``ckpt-*`` files are named,
    not removed."""
    destination = tmp_path / "dst"
    (destination / "sub").mkdir(parents=True)
    for name in ("ckpt-a", "ckpt-inflight-q-0-0-attempt-7", "ckpt-keep", "sub/ckpt-b"):
        (destination / name).write_bytes(b"data")
    (tmp_path / "ckpt-outside").write_bytes(b"not ckpt's")
    record = {"tool": "ckpt", "pid": 1, "host": "h", "started": "t", "files_before": [], "created_dirs": []}
    journal = [
        "file ckpt-a",
        "file ../ckpt-outside",
        "file sub/ckpt-b",
        "file /etc/passwd",
        "prefix ckpt-inflight-q-0-0-attempt-",
    ]
    unfinished = "prefix ckpt-"  # a line its run died writing: it would name every file
    (destination / LOCK_FILE).write_text(json.dumps(record) + "\n" + "\n".join(journal) + "\n" + unfinished)
    before = tree(tmp_path)
    code, _, err = ckpt("rescale", BASE.checkpoint, destination, "-p", "3", *INPUTS, "--engine", "local")
    one_line_error(code, err, f"{destination} holds 1 files of an earlier ckpt run that did not finish ({destination}/ckpt-keep)")
    removed = {"dst/ckpt-a", "dst/ckpt-inflight-q-0-0-attempt-7", f"dst/{LOCK_FILE}"}
    assert tree(tmp_path) == {k: v for k, v in before.items() if k not in removed}


def test_s3_claims_look_only_at_objects_directly_in_dst(ckpt, s3_endpoint):
    """On S3 a run into a prefix that holds another checkpoint one level down succeeds and leaves
    it alone; a claimed prefix is refused naming only what its run wrote directly there."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="nested")
    for key in ("out/sub/_metadata", "out/sub/ckpt-inflight-b-0-0"):
        s3.put_object(Bucket="nested", Key=key, Body=b"another run's checkpoint")
    code, _, err = ckpt("rescale", BASE.checkpoint, "s3://nested/out", "-p", "3", *INPUTS, "--engine", "local")
    assert code == 0, err
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="nested")["Contents"]}
    assert {"out/sub/_metadata", "out/sub/ckpt-inflight-b-0-0", "out/_metadata"} <= keys

    claim = take_claim("s3://nested/held")
    claim.will_create(["ckpt-inflight-x-0-0"])
    s3.put_object(Bucket="nested", Key="held/ckpt-inflight-x-0-0", Body=b"that run's data")
    s3.put_object(Bucket="nested", Key="held/sub/ckpt-inflight-y-0-0", Body=b"not that run's")
    code, _, err = ckpt("rescale", BASE.checkpoint, "s3://nested/held", "-p", "3", *INPUTS, "--engine", "local")
    one_line_error(code, err, "and the 1 files it wrote (s3://nested/held/ckpt-inflight-x-0-0), then run again")
    claim.undo()
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="nested", Prefix="held/")["Contents"]}
    assert keys == {"held/sub/ckpt-inflight-y-0-0"}


# --- chmod never follows links (defect 3) --------------------------------------------------------


def test_a_link_planted_in_dst_during_a_run_leaves_its_target_alone(tmp_path, large):
    """``DST/ckpt-zz -> victim`` planted while a run writes DST: the run opens its own files up
    to the source's permissions and leaves the victim (and the link, not its) alone."""
    victim = tmp_path / "victim"
    victim.write_text("owner-only")
    victim.chmod(0o600)
    shutil.copytree(large[0].parent, tmp_path / "job")
    for path in (tmp_path / "job").rglob("*"):  # readable by all, so that the run opens its files up
        path.chmod(0o755 if path.is_dir() else 0o644)
    destination = tmp_path / "dst"
    args = large_args((tmp_path / "job" / large[0].name, large[1]), destination)
    # once the lock holds its record, the run has listed what DST held before it (a file planted
    # earlier would be refused as an earlier run's leftovers)
    run = start(args, lambda: _lock_holds_record(destination))
    os.symlink(victim, destination / "ckpt-zz")
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "owner-only"
    assert os.readlink(destination / "ckpt-zz") == str(victim)
    modes = {p.name: stat.S_IMODE(p.lstat().st_mode) for p in destination.iterdir() if p.name != "ckpt-zz"}
    assert len(modes) == json.loads(out)["files_written"] + 1 and all(m & 0o044 for m in modes.values()), modes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "job", "victim"]


def test_set_mode_changes_only_a_regular_file_of_its_own(tmp_path):
    io = LocalFileIO()
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o600)
    os.symlink(victim, tmp_path / "link")
    os.link(victim, tmp_path / "hard")
    os.mkfifo(tmp_path / "fifo")
    for name, message in (("link", "is a symbolic link"), ("hard", "hard links"), ("fifo", "is a FIFO")):
        with pytest.raises(StorageError, match=message):
            io.set_mode(str(tmp_path / name), 0o644)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    own = tmp_path / "own"
    own.write_text("y")
    io.set_mode(str(own), 0o640)
    assert stat.S_IMODE(own.stat().st_mode) == 0o640


# --- source files are checked on the descriptor read (defect 4) ---------------------------------


def _swap_for_link(path: Path, target: Path) -> None:
    shutil.move(path, target)
    os.symlink(target, path)


def test_a_shared_file_swapped_for_a_link_out_after_the_checks_is_not_copied(tmp_path):
    """A RocksDB ``shared/`` SST, checked when the session opened, becomes a link out of the job
    directory before the rescale copies it: refused, and DST is left as it was (absent)."""
    checkpoint = copy_job(tmp_path, ROCKSDB)
    secret = tmp_path / "secret"
    with Session.open(str(checkpoint), ROCKSDB.schema, ROCKSDB.plan, "local") as session:
        shared = sorted((checkpoint.parent / "shared").iterdir())[0]
        _swap_for_link(shared, secret)
        before = tree(tmp_path)
        with pytest.raises(StorageError, match=f"{shared} is a symbolic link to {secret}, outside {checkpoint.parent}: refused"):
            rescale(session, str(tmp_path / "dst"), 2)
    assert not (tmp_path / "dst").exists() and tree(tmp_path) == before


def test_a_channel_state_file_swapped_for_a_link_out_after_the_checks_is_not_read(tmp_path):
    """The same for a file a rescale reads rather than copies: the channel-state file its
    engine's tasks read."""
    checkpoint = copy_job(tmp_path)
    with Session.open(str(checkpoint), BASE.schema, BASE.plan, "local") as session:
        victim = Path(sorted(channel_files(session.checkpoint))[0])
        _swap_for_link(victim, tmp_path / "secret")
        before = tree(tmp_path)
        with pytest.raises(StorageError, match=f"{victim} is a symbolic link to {tmp_path / 'secret'}, outside "):
            rescale(session, str(tmp_path / "dst"), 3)
    assert not (tmp_path / "dst").exists() and tree(tmp_path) == before


def test_a_directory_flipped_to_a_link_while_files_are_opened_is_never_followed(tmp_path):
    """A thread flips the job's ``shared`` between its real directory and a link to another
    directory holding a file of the same name, while the checkpoint's storage opens that file
    again and again: every open gives the real file's bytes or is refused, never the other."""
    job = tmp_path / "job"
    (job / "shared").mkdir(parents=True)
    (job / "shared" / "sst").write_bytes(b"inside")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "sst").write_bytes(b"SECRET")
    io = LocalFileIO().confined(str(job))
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            os.rename(job / "shared", job / "real")
            os.symlink(elsewhere, job / "shared")
            time.sleep(0.0001)
            os.remove(job / "shared")
            os.rename(job / "real", job / "shared")
            time.sleep(0.0001)

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes: dict[str, int] = {}
    try:
        for _ in range(3000):
            try:
                outcome = io.read(str(job / "shared" / "sst")).decode()
            except StorageError as exc:  # refused, or caught between the renames
                outcome = "refused" if "symbolic link" in str(exc) else "missing" if "No such file" in str(exc) else str(exc)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        stop.set()
        flipper.join()
    assert set(outcomes) <= {"inside", "refused", "missing"} and outcomes.get("inside") and outcomes.get("refused"), outcomes


# --- FIFOs, devices and huge files where files belong (defect 6) ---------------------------------


def _plant(checkpoint: Path, case: str) -> None:
    channel = Path(sorted(channel_files(Checkpoint.open(str(checkpoint))))[0])
    if case == "metadata-fifo":
        (checkpoint / "_metadata").unlink()
        os.mkfifo(checkpoint / "_metadata")
    elif case == "metadata-dev-zero":
        (checkpoint / "_metadata").unlink()
        os.symlink("/dev/zero", checkpoint / "_metadata")
    elif case == "metadata-sparse-4g":
        with open(checkpoint / "_metadata", "r+b") as f:
            f.truncate(1 << 32)
    elif case == "channel-fifo":
        channel.unlink()
        os.mkfifo(channel)
    elif case == "channel-dev-zero":
        channel.unlink()
        os.symlink("/dev/zero", channel)


FILE_CASES = {
    "metadata-fifo": "_metadata is a FIFO, not a regular file: refused",
    "metadata-dev-zero": "_metadata is a symbolic link to /dev/zero, outside ",
    "metadata-sparse-4g": "_metadata has 4294967296 bytes, more than the 2147483648 ckpt reads: refused",
    "channel-fifo": "is a FIFO, not a regular file: refused",
    "channel-dev-zero": "is a symbolic link to /dev/zero, outside ",
}
FILE_COMMANDS = {
    "inspect": lambda c, d: ["inspect", str(c)],
    "inspect-plan-schema": lambda c, d: ["inspect", str(c), *INPUTS],
    "verify": lambda c, d: ["verify", str(c), *INPUTS],
    "rescale": lambda c, d: ["rescale", str(c), str(d), "-p", "3", *INPUTS, "--engine", "local"],
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_fifos_devices_and_huge_files_fail_fast_in_bounded_memory(tmp_path, case):
    checkpoint = copy_job(tmp_path)
    _plant(checkpoint, case)
    before = tree(tmp_path)
    for name, command in FILE_COMMANDS.items():
        started = time.monotonic()
        run = run_measured([str(CKPT), *command(checkpoint, tmp_path / "dst")], timeout=60, preexec_fn=_limit_memory)
        assert time.monotonic() - started < 20, name
        one_line_error(run.returncode, run.stderr, FILE_CASES[case])
        assert run.peak_kib < 400_000, f"{name} used {run.peak_kib} KiB"
        assert tree(tmp_path) == before, name


def _limit_memory() -> None:
    """At most 4 GiB of address space: a run that reads without bound fails, the machine lives."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_reads_refuse_what_is_not_a_regular_file(tmp_path):
    """Every way of reading a file, on a device, a FIFO and a directory (in a child process
    with bounded memory and time: reading /dev/zero without these checks never ends)."""
    os.mkfifo(tmp_path / "fifo")
    script = f"""
import re
from ckpt_tool.errors import StorageError
from ckpt_tool.storage.local import LocalFileIO
io, fifo, directory = LocalFileIO(), {str(tmp_path / "fifo")!r}, {str(tmp_path)!r}
for path, kind in (("/dev/zero", "a character device"), (fifo, "a FIFO"), (directory, "a directory")):
    for read in (io.read, io.map, lambda p: io.read_range(p, 0, 4), lambda p: io.read_at_most(p, 10), io.size):
        try:
            read(path)
        except StorageError as exc:
            assert re.fullmatch(f"{{re.escape(path)}} is {{kind}}, not a regular file: refused", str(exc)), exc
        else:
            raise AssertionError(path)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory)
    assert run.returncode == 0, run.stderr


def test_a_checkpoint_opened_reads_metadata_by_the_size_of_the_open_file(tmp_path):
    checkpoint = copy_job(tmp_path)
    size = (checkpoint / "_metadata").stat().st_size
    assert LocalFileIO().read_at_most(str(checkpoint / "_metadata"), size) == (checkpoint / "_metadata").read_bytes()
    with pytest.raises(StorageError, match=f"has {size} bytes, more than the {size - 1} ckpt reads"):
        LocalFileIO().read_at_most(str(checkpoint / "_metadata"), size - 1)
    assert Checkpoint.open(str(checkpoint)).metadata.checkpoint_id == 3


# --- hostile lock files (defect 5c) --------------------------------------------------------------


def test_a_stale_lock_of_deeply_nested_json_is_a_lock_without_a_record(ckpt, tmp_path):
    """Read without recursion: a dead one is taken over (it holds no journal, so nothing is
    removed); a live one is refused, in one line."""
    destination = tmp_path / "dst"
    destination.mkdir()
    (destination / LOCK_FILE).write_text("[" * 200_000 + "]" * 200_000)
    held = os.open(destination / LOCK_FILE, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # its run is alive
    try:
        code, _, err = ckpt("rescale", BASE.checkpoint, destination, "-p", "3", *INPUTS, "--engine", "local")
        one_line_error(code, err, "is being written by another ckpt run (a lock without a record)")
    finally:
        os.close(held)
    code, _, err = ckpt("rescale", BASE.checkpoint, destination, "-p", "3", *INPUTS, "--engine", "local", "--json")
    assert code == 0, err
    assert not (destination / LOCK_FILE).exists() and verify(destination, INPUTS) == 0


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_lock_that_is_not_a_regular_file_is_refused_and_untouched(ckpt, tmp_path, kind):
    """A lock that is a link to someone's file would have its target truncated and rewritten;
    one that is a FIFO could block: both are refused, at once, and left as they are."""
    victim = tmp_path / "victim"
    victim.write_text("someone's file")
    victim.chmod(0o600)
    destination = tmp_path / "dst"
    destination.mkdir()
    if kind == "symlink":
        os.symlink(victim, destination / LOCK_FILE)
    else:
        os.mkfifo(destination / LOCK_FILE)
    before = tree(tmp_path)
    code, _, err = ckpt("rescale", BASE.checkpoint, destination, "-p", "3", *INPUTS, "--engine", "local")
    expected = "is a symbolic link, not" if kind == "symlink" else "is not a regular file, so not"
    one_line_error(code, err, f"{destination / LOCK_FILE} {expected} a lock ckpt wrote: remove it, or choose another destination")
    assert tree(tmp_path) == before and stat.S_IMODE(victim.stat().st_mode) == 0o600
