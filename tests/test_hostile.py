"""Hostile and broken checkpoints, and unlucky operators: every case asserts the exit code, the
message, that nothing was written outside DST, and that nothing was lost or deleted.

The attacks are crafted from a real checkpoint (Flink 1.20, channel state in files) by rewriting
its ``_metadata`` with ckpt's own writer; the runs are the installed ``ckpt`` in a subprocess
where a process must die or two must race, and in-process elsewhere.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from measured import run_measured

from catalog import ROOT, fixture_named, tree_digest
from ckpt_tool.flink.metadata import iter_stream_handles, read_metadata, write_metadata
from ckpt_tool.flink.model import FileHandle, RelativeFileHandle
from ckpt_tool.writer.claim import LOCK_FILE, take_claim

BASE = fixture_named("flink120-hashmap-p2")  # relative handles, channel state in one file
CKPT = Path(sys.executable).parent / "ckpt"
INPUTS = ["--plan", BASE.plan, "--schema", BASE.schema]
RECORDS = sum(c["records"] for c in BASE.expected["logical_channels"])  # in-flight records, by Flink's reader
SOURCE_DIGEST = tree_digest(BASE.checkpoint.parent)  # checked by the last test: no run wrote to the source


def copy_job(tmp_path: Path) -> Path:
    """A copy of the fixture's job directory; returns its checkpoint directory."""
    shutil.copytree(BASE.checkpoint.parent, tmp_path / "job")
    return tmp_path / "job" / BASE.checkpoint.name


def rewrite_metadata(checkpoint: Path, change) -> str:
    """Apply ``change(handle)`` to the first relative file handle (and every handle sharing its
    file); returns the file's name."""
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    handles = [h for h in iter_stream_handles(metadata) if isinstance(h, RelativeFileHandle)]
    name = handles[0].relative_path
    for handle in handles:
        if handle.relative_path == name:
            change(handle)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return name


def to_file_handle(checkpoint: Path, name: str, path: str) -> None:
    """Every channel handle in the relative file ``name`` made to name ``path`` as a FileHandle."""
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    for op in metadata.operators:
        for s in op.subtasks:
            for h in s.input_channels + s.output_channels:
                if isinstance(h.delegate, RelativeFileHandle) and h.delegate.relative_path == name:
                    h.delegate = FileHandle(path, h.delegate.size)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))


def tree(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` and its bytes (the record of what a run may not touch)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_line_error(code: int, err: str, expected: str, exit_code: int = 2) -> None:
    assert code == exit_code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: "), err
    assert expected in err, err


def rescale_args(src, dst, parallelism: int = 3) -> list[str]:
    return ["rescale", str(src), str(dst), "-p", str(parallelism), *INPUTS, "--engine", "local", "--json"]


COMMANDS = {
    "rescale-same-parallelism": lambda src, dst: rescale_args(src, dst, 2),
    "rescale": lambda src, dst: rescale_args(src, dst, 3),
    "repair": lambda src, dst: ["repair", str(src), str(dst), *INPUTS, "--engine", "local"],
    "inspect": lambda src, dst: ["inspect", str(src)],
}


# --- paths out of the checkpoint ------------------------------------------------------------------


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("attack", ["relative-dotdot", "relative-absolute", "absolute-dotdot"])
def test_handle_paths_leading_out_are_refused(ckpt, tmp_path, attack, command):
    checkpoint = copy_job(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()

    def change(handle):
        source = checkpoint / handle.relative_path
        if source.exists():
            shutil.move(source, outside / handle.relative_path)
        if attack == "relative-dotdot":
            handle.relative_path = "../../outside/" + Path(handle.relative_path).name
        elif attack == "relative-absolute":
            handle.relative_path = str(outside / Path(handle.relative_path).name)

    name = rewrite_metadata(checkpoint, change)
    if attack == "absolute-dotdot":  # a FileHandle in the checkpoint directory that climbs out
        to_file_handle(checkpoint, name, f"file:{checkpoint}/../../outside/{name}")
    before = tree(tmp_path)
    destination = tmp_path / "dst" / "a" / "b"
    code, _, err = ckpt(*COMMANDS[command](checkpoint, destination))
    one_line_error(code, err, "leads out of the checkpoint; refused")
    assert tree(tmp_path) == before and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("command", ["inspect", "rescale"])
@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_a_path_holding_a_nul_is_refused_as_the_metadata_is_read(ckpt, tmp_path, kind, command):
    """Java reads a NUL in a path (Flink's restore then fails to open the file); ckpt refuses the
    metadata with one line, before any path is resolved (it had been an internal error)."""
    checkpoint = copy_job(tmp_path)

    def change(handle):
        if kind == "relative":
            handle.relative_path = handle.relative_path[:3] + "\x00" + handle.relative_path[4:]

    name = rewrite_metadata(checkpoint, change)
    if kind == "absolute":
        to_file_handle(checkpoint, name, f"file:{checkpoint}/\x00{name}")
    before = tree(tmp_path)
    code, _, err = ckpt(*COMMANDS[command](checkpoint, tmp_path / "dst" / "chk-1"))
    one_line_error(code, err, "path holds a NUL character, which no file's name can")
    assert tree(tmp_path) == before and not (tmp_path / "dst").exists()


def test_s3_keys_leading_out_are_refused(ckpt, tmp_path, s3_endpoint):
    """From S3, an object key with ``..`` in a handle is refused before anything is read or written."""
    import boto3

    checkpoint = copy_job(tmp_path)
    rewrite_metadata(checkpoint, lambda h: setattr(h, "relative_path", "../../../../../tmp/x/" + h.relative_path))
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="hostile")
    for path in checkpoint.rglob("*"):
        s3.upload_file(str(path), "hostile", f"job/chk-3/{path.relative_to(checkpoint)}")
    destination = tmp_path / "dst"
    code, _, err = ckpt(*rescale_args("s3://hostile/job/chk-3", destination, 2))
    one_line_error(code, err, "leads out of the checkpoint; refused")
    assert not destination.exists() and not Path("/tmp/x").exists()


def test_symlink_out_of_the_job_directory_is_refused(ckpt, tmp_path):
    checkpoint = copy_job(tmp_path)
    secret = tmp_path / "secret"
    name = rewrite_metadata(checkpoint, lambda h: None)
    shutil.move(checkpoint / name, secret)
    os.symlink(secret, checkpoint / name)
    for command in COMMANDS.values():
        code, _, err = ckpt(*command(checkpoint, tmp_path / "dst"))
        one_line_error(code, err, "is a symbolic link to")
        assert not (tmp_path / "dst").exists()


def test_a_symlink_inside_the_job_directory_is_followed(ckpt, tmp_path):
    checkpoint = copy_job(tmp_path)
    name = rewrite_metadata(checkpoint, lambda h: None)
    shutil.move(checkpoint / name, checkpoint.parent / "moved")
    os.symlink(checkpoint.parent / "moved", checkpoint / name)
    code, out, err = ckpt(*rescale_args(checkpoint, tmp_path / "dst"))
    assert code == 0, err
    assert json.loads(out)["records_out"] == RECORDS


def test_outputs_are_never_more_readable_than_their_source(ckpt, tmp_path):
    checkpoint = copy_job(tmp_path)
    name = rewrite_metadata(checkpoint, lambda h: None)
    os.chmod(checkpoint / name, 0o600)
    for parallelism, destination in ((2, tmp_path / "copied"), (3, tmp_path / "rescaled")):
        code, _, err = ckpt(*rescale_args(checkpoint, destination, parallelism))
        assert code == 0, err
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in destination.iterdir()}
        assert modes and all(mode & 0o077 == 0 for mode in modes.values()), modes
        assert all(p.name == "_metadata" or p.name.startswith("ckpt-") for p in destination.iterdir())


# --- one writer per destination -------------------------------------------------------------------


def test_a_live_claim_makes_a_second_run_exit_2_and_touch_nothing(ckpt, tmp_path):
    destination = tmp_path / "dst"
    claim = take_claim(str(destination))  # another run, alive (this process holds its flock)
    claim.will_create(["ckpt-inflight-x-0-0"])
    (destination / "ckpt-inflight-x-0-0").write_bytes(b"another run's data")
    before = tree(destination)
    try:
        for command in ("rescale", "repair"):
            code, _, err = ckpt(*COMMANDS[command](BASE.checkpoint, destination))
            one_line_error(code, err, "is being written by another ckpt run (pid ")
            assert tree(destination) == before
    finally:
        claim.undo()
    assert not destination.exists()


def test_two_runs_into_one_destination_one_wins_and_its_output_stays(tmp_path):
    """A Spark rescale and a local one race into one DST: exactly one writes the checkpoint, the
    other exits 2 without deleting anything of it, and the output holds every record."""
    destination = tmp_path / "dst"
    runs = [
        subprocess.Popen(
            [str(CKPT), *rescale_args(BASE.checkpoint, destination)[:-3], "--engine", engine, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for engine in ("spark", "local")
    ]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    assert "is being written by another ckpt run" in loser or "already exists; choose a new destination" in loser, loser
    assert "Traceback" not in loser and len(loser.strip().splitlines()) == 1
    verify = subprocess.run([str(CKPT), "verify", str(destination), *INPUTS, "--engine", "local", "--json"], capture_output=True)
    report = json.loads(verify.stdout)
    assert verify.returncode == 0, report
    assert not (destination / LOCK_FILE).exists()


def test_a_failing_run_removes_only_what_it_created(ckpt, tmp_path):
    """The user's directories, empty or not, and files stay; the directories the run made go."""
    checkpoint = copy_job(tmp_path)
    name = rewrite_metadata(checkpoint, lambda h: None)
    with open(checkpoint / name, "r+b") as f:  # the last record of the file, cut short
        f.truncate(os.path.getsize(checkpoint / name) - 10)
    rewrite_metadata(checkpoint, lambda h: setattr(h, "size", os.path.getsize(checkpoint / name)))
    users = tmp_path / "users"
    (users / "empty").mkdir(parents=True)
    (users / "kept.txt").write_text("mine")
    for destination in (users / "empty", users / "new" / "deeper" / "dst", users):
        code, _, err = ckpt(*rescale_args(checkpoint, destination))
        assert code == 2, err
        assert (users / "empty").is_dir() and (users / "kept.txt").read_text() == "mine"
        assert not (users / "new").exists()
        assert sorted(p.name for p in users.rglob("*")) == ["empty", "kept.txt"]


def test_files_of_an_earlier_run_without_a_lock_are_named(ckpt, tmp_path):
    destination = tmp_path / "dst"
    destination.mkdir()
    (destination / "ckpt-inflight-0a6c-0-0").write_bytes(b"left over")
    code, _, err = ckpt(*rescale_args(BASE.checkpoint, destination))
    one_line_error(code, err, "holds 1 files of an earlier ckpt run that did not finish")
    assert sorted(p.name for p in destination.iterdir()) == ["ckpt-inflight-0a6c-0-0"]


# Fractions of the time an uninterrupted run holds its claim; on a loaded machine runs vary, so
# points early in the run come again to make sure that at least three runs die in the middle.
KILL_AT = [0.0, 0.2, 0.4, 0.6, 0.8, 0.1, 0.3, 0.05]


def start_and_wait_for_claim(args: list[str], destination: Path) -> tuple[subprocess.Popen, float]:
    """Start a run in a session of its own; returns it once its lock exists, and that moment."""
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (destination / LOCK_FILE).exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    return run, time.monotonic()


@pytest.fixture(scope="module")
def large_checkpoint(tmp_path_factory) -> tuple[Path, list[str]]:
    """A generated checkpoint of 60 MB of channel state (the bench's generator, proven by a Flink
    restore in test_bench_generator), whose rescale lasts long enough to be killed in the middle."""
    sys.path.insert(0, str(ROOT / "bench"))
    from generate import FIXTURE, SCHEMA, generate

    source = tmp_path_factory.mktemp("large") / "job" / "chk-3"
    generate(source, 4, 60_000_000)
    return source, ["--plan", str(FIXTURE / "plan.json"), "--schema", str(SCHEMA)]


def test_kill_9_at_several_points_then_a_rerun_succeeds(tmp_path, large_checkpoint):
    """``kill -9`` of a rescale at several points after it claimed DST; the rerun removes what
    the dead run left, succeeds, and its output holds what an uninterrupted run's holds."""
    source, inputs = large_checkpoint

    def args(destination: Path) -> list[str]:
        return [str(CKPT), "rescale", str(source), str(destination), "-p", "3", *inputs, "--engine", "local", "--json"]

    clean, claimed_at = start_and_wait_for_claim(args(tmp_path / "clean"), tmp_path / "clean")
    out, err = clean.communicate(timeout=300)
    held = time.monotonic() - claimed_at
    assert clean.returncode == 0, err
    expected = json.loads(out)["records_out"]
    interrupted = 0
    for index, fraction in enumerate(KILL_AT):
        destination = tmp_path / f"dst{index}"
        run, claimed_at = start_and_wait_for_claim(args(destination), destination)
        time.sleep(max(0.0, claimed_at + fraction * held - time.monotonic()))
        os.killpg(run.pid, signal.SIGKILL)  # ckpt and its worker processes, as a container's end kills them
        run.communicate()
        if run.returncode != -signal.SIGKILL or (destination / "_metadata").exists():
            continue  # it finished first
        interrupted += 1
        rerun = subprocess.run(args(destination), capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        report = json.loads(rerun.stdout)
        assert report["records_out"] == expected and report["inflation"] == 1.0
        assert not (destination / LOCK_FILE).exists()
        assert sorted(p.name for p in destination.iterdir()) == sorted(p.name for p in (tmp_path / "clean").iterdir())
        if interrupted == 5:
            break
    assert interrupted >= 3, f"only {interrupted} runs were killed before they finished"


# --- a full disk ----------------------------------------------------------------------------------


def _limit_file_size(limit: int):
    """Writes past ``limit`` bytes fail with EFBIG, as on a full disk (the signal is ignored)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_a_full_disk_fails_cleanly_and_leaves_nothing(tmp_path, engine):
    """A small tmpfs as DST (root may mount one); where mounting is not allowed, a file-size
    limit that makes writes fail the same way."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(small)], capture_output=True).returncode == 0
    try:
        args = [str(CKPT), *rescale_args(BASE.checkpoint, small / "dst")[:-3], "--engine", engine]
        run = subprocess.run(
            args, capture_output=True, text=True, timeout=300, preexec_fn=None if mounted else _limit_file_size(40_000)
        )
        assert run.returncode == 2, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
        assert "No space left on device" in run.stderr or "File too large" in run.stderr, run.stderr
        assert list(small.iterdir()) == []
    finally:
        if mounted:
            subprocess.run(["umount", str(small)], check=True)


# --- absurd sizes ---------------------------------------------------------------------------------


def _absurd(tmp_path: Path, kind: str) -> Path:
    checkpoint = copy_job(tmp_path)
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    op = next(o for o in metadata.operators if any(s.input_channels for s in o.subtasks))
    if kind == "parallelism":
        op.parallelism = 2**31 - 1
    elif kind == "max-parallelism":
        op.max_parallelism = 2**31 - 1
    else:  # one buffer listed four million times: a 32 MB _metadata
        handle = next(h for s in op.subtasks for h in s.input_channels if h.offsets)
        handle.offsets = [handle.offsets[0]] * 4_000_000
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint


@pytest.mark.parametrize(
    "kind, message",
    [
        ("parallelism", "parallelism 2147483647 is outside 1 to the max parallelism 128"),
        ("max-parallelism", "max parallelism 2147483647 is outside 1 to 32768"),
        ("repeated-offset", "repeats or overlaps the one before"),
    ],
)
def test_absurd_sizes_fail_fast_in_bounded_memory(tmp_path, kind, message):
    checkpoint = _absurd(tmp_path, kind)
    for command in (["inspect", str(checkpoint), "--schema", BASE.schema], ["verify", str(checkpoint), *INPUTS]):
        started = time.monotonic()
        run = run_measured([str(CKPT), *command], timeout=120)
        assert time.monotonic() - started < 20
        assert run.returncode == 2 and message in run.stderr + run.stdout, (run.stdout, run.stderr)
        assert run.peak_kib < 1_000_000, f"{command[0]} used {run.peak_kib} KiB"


def test_the_source_checkpoint_was_never_modified():
    assert tree_digest(BASE.checkpoint.parent) == SOURCE_DIGEST


def test_an_s3_destination_claimed_by_another_run_is_refused_with_what_to_remove(ckpt, s3_endpoint):
    """S3 cannot tell whether the owner of a claim is alive: the second run exits 2, touches
    nothing, and names exactly what to remove should that run be dead."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="claimed")
    claim = take_claim("s3://claimed/dst")
    claim.will_create(["ckpt-inflight-x-0-0"])
    s3.put_object(Bucket="claimed", Key="dst/ckpt-inflight-x-0-0", Body=b"that run's data")
    objects = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="claimed")["Contents"])
    code, _, err = ckpt(*rescale_args(BASE.checkpoint, "s3://claimed/dst"))
    one_line_error(code, err, "s3://claimed/dst is claimed by another ckpt run (pid ")
    assert "remove s3://claimed/dst/_ckpt_lock and the 1 files it wrote (s3://claimed/dst/ckpt-inflight-x-0-0)" in err
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket="claimed")["Contents"]) == objects
    claim.undo()
    assert "Contents" not in s3.list_objects_v2(Bucket="claimed")


def test_an_s3_endpoint_that_dies_mid_run_is_reported_first(tmp_path, large_checkpoint):
    """The store goes away while a rescale writes to it: the error reported is the write that
    failed, with the cleanup's failure and what is left to remove after it, in one line."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env.update(AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    s3.create_bucket(Bucket="dying")
    source, inputs = large_checkpoint
    args = [str(CKPT), "rescale", str(source), "s3://dying/dst", "-p", "3", *inputs, "--engine", "local"]
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while "Contents" not in s3.list_objects_v2(Bucket="dying", Prefix="dst/_ckpt_lock") and time.monotonic() < deadline:
        time.sleep(0.005)
    server.stop()
    _, err = run.communicate(timeout=300)
    assert run.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    first, _, cleanup = err.partition("; removing what this run wrote to s3://dying/dst failed too")
    assert "cannot reach S3 endpoint" in first and "cannot reach S3 endpoint" in cleanup, err
    assert "remove its ckpt-* files and _ckpt_lock there" in cleanup
