"""Errors that ckpt reports to the user as one line with a documented exit code."""

from collections.abc import Iterator
from contextlib import contextmanager

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_UNUSABLE_INPUT = 2
EXIT_INTERNAL = 3


class CkptError(Exception):
    """An error caused by the input or the environment, not by a bug in ckpt."""

    exit_code = EXIT_UNUSABLE_INPUT


class StorageError(CkptError):
    """A file or object could not be read or written."""


class AlreadyExistsError(StorageError):
    """A file ckpt was to create exists already: ckpt never overwrites files."""


class CheckpointFormatError(CkptError):
    """Bytes that are not what Flink writes."""


class OutputExistsError(CkptError):
    """The destination already holds a checkpoint; ckpt never overwrites one."""


@contextmanager
def naming(where: str) -> Iterator[None]:
    """Errors about some channels' data say which (the exchange and the channels)."""
    try:
        yield
    except CkptError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
