"""Turning ``pkg.module:Name`` from the worker's own configuration into an object.

The names come from the command line or the environment of the worker process,
never from anything read from Redis: a task can only choose data, not code.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_object(spec: str) -> Any:
    """Import ``pkg.module:Name`` and return ``Name``; a class is instantiated with no arguments."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {spec!r}: {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"module {module_name!r} has no {attr!r} (from {spec!r})") from exc
    return obj() if isinstance(obj, type) else obj
