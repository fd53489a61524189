"""Checking what input files hold (plans, compiled plans and schema files): each value read is
tested against what it must be, and a file that does not fit is said in one line."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_tool.errors import CkptError

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # what could break a line, or a terminal


class InputFileError(CkptError):
    """An input file (plan, compiled plan, schema) that cannot be used, said in one line whatever
    text of the file the message quotes."""

    def __init__(self, message: str):
        super().__init__(_CONTROL.sub(lambda match: repr(match.group())[1:-1], message))


# --- checking what input files hold (plans, compiled plans and schema files) --------------------


@dataclass(frozen=True)
class Expected:
    """What a value read from an input file must be: said in words, and tested."""

    description: str
    test: Callable[[Any], bool]


def _java_int(low: int) -> Callable[[Any], bool]:
    # bool is a subclass of int: `true` is no number here
    return lambda value: type(value) is int and low <= value < 2**31


STRING = Expected("a string", lambda value: isinstance(value, str))
NON_NEGATIVE = Expected("an integer from 0 to 2147483647", _java_int(0))
POSITIVE = Expected("an integer from 1 to 2147483647", _java_int(1))
LIST = Expected("a list", lambda value: isinstance(value, list))
OBJECT = Expected("an object", lambda value: isinstance(value, dict))
_REQUIRED = object()


def shown(value: Any) -> str:
    """A value as one short line (JSON's spelling, which TOML shares for scalars)."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def checked(value: Any, expected: Expected, error: type[InputFileError], what: str) -> Any:
    """``value`` if it is what ``expected`` says, else ``error`` saying what ``what`` must be."""
    if not expected.test(value):
        raise error(f"{what} must be {expected.description}, not {shown(value)}")
    return value


def checked_key(
    document: dict, key: str, expected: Expected, error: type[InputFileError], default: Any = _REQUIRED, within: str = ""
) -> Any:
    """``document[key]``, checked; ``default`` where the key is absent (without one it is required).
    ``within`` is where the document is (``nodes[2]``), for the message."""
    what = f"{within}.{key}" if within else key
    if key in document:
        return checked(document[key], expected, error, what)
    if default is _REQUIRED:
        raise error(f"{what!r} is required")
    return default
