"""The benchmark's generated checkpoints are valid: real Flink restores a small one exactly."""

import json
import sys
from pathlib import Path

import pytest

import flink_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from generate import generate  # noqa: E402


@pytest.mark.flink
def test_generated_checkpoint_restores_with_exact_count(tmp_path):
    checkpoint = tmp_path / "job" / "chk-3"
    info = generate(checkpoint, 3, 1_500_000)
    assert info["generated_records"] > 5000
    assert json.loads((tmp_path / "job" / "chk-3.json").read_text()) == info
    assert flink_env.restore_count("2.3.0", checkpoint, 3, backend="hashmap") == info["expected_count"]
