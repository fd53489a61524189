"""How long ckpt waits for a store that does not answer: the same settings for every object store.

A stalled endpoint (one that accepts connections and never answers) fails after about
``attempts`` x ``read`` seconds (30 s by default) instead of a client library's minutes. Throttling
and 5xx answers are retried as each store's client does; only connections that fail or go silent
are limited here. The settings are environment variables, so that Spark executors get them too:
``CKPT_IO_CONNECT_TIMEOUT`` (seconds per connection attempt, default 3), ``CKPT_IO_TIMEOUT``
(seconds of silence on an open connection, default 10) and ``CKPT_IO_ATTEMPTS`` (tries of a request
whose connection failed or went silent, default 3). ``ckpt --io-timeout/--io-attempts`` set them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ckpt_tool.errors import StorageError

CONNECT_TIMEOUT_VARIABLE = "CKPT_IO_CONNECT_TIMEOUT"
READ_TIMEOUT_VARIABLE = "CKPT_IO_TIMEOUT"
ATTEMPTS_VARIABLE = "CKPT_IO_ATTEMPTS"
VARIABLES = (CONNECT_TIMEOUT_VARIABLE, READ_TIMEOUT_VARIABLE, ATTEMPTS_VARIABLE)


@dataclass(frozen=True)
class Patience:
    connect: float = 3.0  # seconds per connection attempt
    read: float = 10.0  # seconds without a byte from an open connection
    attempts: int = 3  # tries of a request whose connection failed or went silent

    @staticmethod
    def from_environment() -> Patience:
        default = Patience()
        return Patience(
            _number(CONNECT_TIMEOUT_VARIABLE, default.connect),
            _number(READ_TIMEOUT_VARIABLE, default.read),
            int(_number(ATTEMPTS_VARIABLE, default.attempts, whole=True)),
        )

    def stalled(self) -> str:
        """Why a request was given up on an endpoint that stopped answering."""
        return f"no answer within {self.read:g} s ({self.attempts} attempts; {READ_TIMEOUT_VARIABLE} sets the wait)"

    def unreachable(self) -> str:
        return f"connection timed out ({self.connect:g} s, {self.attempts} attempts)"


def _number(variable: str, default: float, whole: bool = False) -> float:
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not (0 < value <= 86400) or (whole and value != int(value)):
        kind = "a whole number" if whole else "a number of seconds"
        raise StorageError(f"{variable}={text!r} is not {kind} between 0 and 86400")
    return value


def os_reason(exc: BaseException) -> str:
    """Why a connection failed, briefly: the OS's words (``Connection refused``) where some
    exception ``exc`` wraps holds them, else the first line of its message."""
    found = _os_words(exc)
    if found:
        return found
    text = str(exc)
    return "Connection refused" if "Connection refused" in text else first_line(text)


def _os_words(exc: BaseException) -> Optional[str]:
    """The ``strerror`` of the nearest OSError among the exceptions ``exc`` wraps: as its cause or
    context, or where a store's client keeps it (``inner_exception``: Azure; ``reason``: urllib3;
    an argument: requests; ``kwargs["error"]``: botocore), nearest first."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending and len(seen) < 32:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError) and error.strerror:
            return str(error.strerror)
        kwargs = getattr(error, "kwargs", None)
        wrapped = (
            getattr(error, "inner_exception", None),
            getattr(error, "reason", None),
            kwargs.get("error") if isinstance(kwargs, dict) else None,
            *getattr(error, "args", ()),
            error.__cause__,
            error.__context__,
        )
        pending.extend(inner for inner in wrapped if isinstance(inner, BaseException))
    return None


def first_line(text: Optional[str]) -> str:
    """The first line of a store's message, at most 300 characters: errors are one line."""
    return ((text or "").strip().splitlines() or [""])[0][:300]
