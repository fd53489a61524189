"""Flink's on-disk checkpoint format: ``_metadata`` and channel-state files."""
