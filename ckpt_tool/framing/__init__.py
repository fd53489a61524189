"""The record path's framing loops: the compiled module ``_framing`` (ckpt_tool/framing/_framing.c),
or, where it cannot load (a Spark executor of another platform or Python build than the one ckpt
was built for), the equivalent pure Python/NumPy module ``_framing_py``, which is slower.

``CKPT_FRAMING=python`` chooses the pure module. ``COMPILED`` says which one this process uses
and ``FALLBACK_REASON`` why the compiled one was not used; the Spark engine asks its executors
and reports a fallback as a warning.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

FALLBACK_REASON: Optional[str] = None
if os.environ.get("CKPT_FRAMING") == "python":
    FALLBACK_REASON = "CKPT_FRAMING=python"
else:
    try:
        importlib.import_module("ckpt_tool.framing._framing")
    except ImportError as exc:  # no compiled module for this platform: the pure one
        FALLBACK_REASON = f"{type(exc).__name__}: {exc}"
COMPILED = FALLBACK_REASON is None
framing: ModuleType = importlib.import_module("ckpt_tool.framing._framing" if COMPILED else "ckpt_tool.framing._framing_py")
