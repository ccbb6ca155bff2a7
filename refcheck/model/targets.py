"""A user's object named ``module:attr`` (``--impl``, ``--op-card``): one way to import it."""
from __future__ import annotations

import importlib
import os
import sys


def import_target(target: str, *, where: str, expected: str, error: type[Exception] = ValueError):
    """The object ``target`` (``"module:attr"``) names, the working directory importable first as with
    ``python -m``. Anything off raises ``error`` with a message starting with ``where`` (the option
    and its value) and saying what was ``expected``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise error(f"{where}: expected {expected}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # not found, or the module itself fails to import
        raise error(f"{where}: cannot import module {module_name!r}: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise error(f"{where}: module {module_name!r} ({module.__file__}) has no attribute {attr!r}")
    return getattr(module, attr)
