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
