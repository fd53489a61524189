from ckpt_tool.flink.checkpoint import PathMapping
from ckpt_tool.flink.model import CheckpointMetadata, FileHandle, KeyGroupsHandle, OperatorState, SubtaskState


def metadata_with(*paths: str) -> CheckpointMetadata:
    subtasks = [SubtaskState(i, managed_keyed=KeyGroupsHandle(12, 0, [0], FileHandle(p, 1), "id")) for i, p in enumerate(paths)]
    return CheckpointMetadata(6, 7, [], [OperatorState(bytes(16), len(paths), 128, subtasks=subtasks)], b"")


def test_moved_checkpoint_resolves_exclusive_and_shared_files():
    md = metadata_with("file:/old/job/chk-7/a", "file:/old/job/shared/b")
    mapping = PathMapping.detect(md, "s3://bucket/new/job/chk-7")
    assert mapping.resolve("file:/old/job/chk-7/a") == "s3://bucket/new/job/chk-7/a"
    assert mapping.resolve("file:/old/job/shared/b") == "s3://bucket/new/job/shared/b"
    assert mapping.resolve("file:/elsewhere/c") == "/elsewhere/c"


def test_job_dir_found_from_shared_files_alone():
    md = metadata_with("s3a://b/old/job/shared/x")
    mapping = PathMapping.detect(md, "/local/copy/chk-7")
    assert mapping.resolve("s3p://b/old/job/shared/x") == "/local/copy/shared/x"


def test_checkpoint_in_place_is_identity():
    md = metadata_with("file:/job/chk-7/a")
    assert PathMapping.detect(md, "/job/chk-7").resolve("file:/job/chk-7/a") == "/job/chk-7/a"


def test_files_nested_in_the_checkpoint_directory_win_over_shared():
    # a checkpoint written by ckpt keeps RocksDB's shared files inside itself: <dst>/shared/<file>
    md = metadata_with("file:/out/job/chk-7/shared/a", "file:/out/job/chk-7/b")
    mapping = PathMapping.detect(md, "/moved/chk-7")
    assert mapping.resolve("file:/out/job/chk-7/shared/a") == "/moved/chk-7/shared/a"
    assert PathMapping.detect(md, "/out/job/chk-7").resolve("file:/out/job/chk-7/shared/a") == "/out/job/chk-7/shared/a"


def test_job_dir_found_from_file_merging_directories_alone():
    # file merging (FLIP-306) keeps every file one level below shared/ or taskowned/
    md = metadata_with("file:/old/job/taskowned/job_1_tm_2/a", "file:/old/job/shared/job_1_op_3_0_2/b")
    mapping = PathMapping.detect(md, "/moved/job/chk-7")
    assert mapping.resolve("file:/old/job/taskowned/job_1_tm_2/a") == "/moved/job/taskowned/job_1_tm_2/a"
    assert mapping.resolve("file:/old/job/shared/job_1_op_3_0_2/b") == "/moved/job/shared/job_1_op_3_0_2/b"


def test_a_job_restored_in_claim_mode_keeps_the_files_of_the_job_before_where_they_are():
    # restored in CLAIM mode, job B's checkpoints reference job A's shared files where A wrote
    # them; with no file in B's chk-7 (private state inline) the job directory is the one named as
    # the checkpoint's parent, whichever file the metadata lists first
    md = metadata_with("file:/ck/A/shared/x", "file:/ck/B/shared/y")
    in_place = PathMapping.detect(md, "/ck/B/chk-7")
    assert in_place.resolve("file:/ck/A/shared/x") == "/ck/A/shared/x"
    assert in_place.resolve("file:/ck/B/shared/y") == "/ck/B/shared/y"
    moved = PathMapping.detect(md, "/copy/B/chk-7")
    assert moved.resolve("file:/ck/A/shared/x") == "/ck/A/shared/x"
    assert moved.resolve("file:/ck/B/shared/y") == "/copy/B/shared/y"


def test_moved_where_its_name_is_not_kept_the_job_directory_most_files_lie_under_is_the_original():
    md = metadata_with("file:/ck/A/shared/x", "file:/ck/B/shared/y", "file:/ck/B/shared/z")
    mapping = PathMapping.detect(md, "/elsewhere/chk-7")
    assert mapping.original_job_dir == "/ck/B"
    assert mapping.resolve("file:/ck/B/shared/z") == "/elsewhere/shared/z"
    assert mapping.resolve("file:/ck/A/shared/x") == "/ck/A/shared/x"


def test_the_files_of_the_job_before_copied_along_are_read_beside_the_checkpoint():
    # a copy of the whole checkpoints directory keeps job A beside job B: A's files are read there
    # (looked for once, on A's first file); where the copy does not hold them, where Flink wrote them
    md = metadata_with("file:/ck/A/shared/x", "file:/ck/A/shared/w", "file:/ck/B/shared/y", "file:/ck/Z/elsewhere/v")
    asked: list[str] = []

    def copied(path: str) -> bool:
        asked.append(path)
        return path.startswith("/copy/")

    moved = PathMapping.detect(md, "/copy/B/chk-7", copied)
    assert asked == ["/copy/A/shared/x"]
    assert moved.resolve("file:/ck/A/shared/x") == "/copy/A/shared/x"
    assert moved.resolve("file:/ck/A/shared/w") == "/copy/A/shared/w"
    assert moved.resolve("file:/ck/B/shared/y") == "/copy/B/shared/y"
    assert moved.resolve("file:/ck/Z/elsewhere/v") == "/ck/Z/elsewhere/v"
    assert PathMapping.detect(md, "/other/B/chk-7", lambda path: False).resolve("file:/ck/A/shared/x") == "/ck/A/shared/x"
    in_place = PathMapping.detect(md, "/ck/B/chk-7", copied)
    assert asked == ["/copy/A/shared/x"] and in_place.resolve("file:/ck/A/shared/x") == "/ck/A/shared/x"
    # a job directory in another checkpoints directory is not looked for beside this one
    md = metadata_with("file:/elsewhere/A/shared/x", "file:/ck/B/shared/y")
    assert PathMapping.detect(md, "/copy/B/chk-7", copied).resolve("file:/elsewhere/A/shared/x") == "/elsewhere/A/shared/x"


def test_a_checkpoint_with_only_another_jobs_files_not_beside_it_was_not_moved():
    # ckpt's output carries its own files relative to itself and references a CLAIM-mode job's
    # files where it found them: where they are still there and not beside it, read as written
    md = metadata_with("file:/copy/A/shared/x", "file:/copy/A/shared/w")
    where_written = PathMapping.detect(md, "/out/chk-1", lambda path: path.startswith("/copy/"))
    assert where_written.resolve("file:/copy/A/shared/x") == "/copy/A/shared/x"
    beside = PathMapping.detect(md, "/moved/chk-1", lambda path: path == "/moved/shared/x")
    assert beside.resolve("file:/copy/A/shared/w") == "/moved/shared/w"
    # found nowhere: read as moved, so that what is missing is named where the checkpoint is now
    assert PathMapping.detect(md, "/moved/chk-1", lambda path: False).resolve("file:/copy/A/shared/w") == "/moved/shared/w"
    # where written in another kind of store (a local path, the checkpoint on S3): read as moved
    on_s3 = PathMapping.detect(md, "s3://b/moved/chk-1", lambda path: path.startswith("/copy/"))
    assert on_s3.resolve("file:/copy/A/shared/w") == "s3://b/moved/shared/w"
