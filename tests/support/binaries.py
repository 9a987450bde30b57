"""The system programs tests run (redis-server, redis-cli, chromium): found on PATH, or the test is skipped, and
under CI (``CI=true``) failed instead, so that CI never passes by skipping."""

from __future__ import annotations

import os
import shutil

import pytest


def require(program: str, install: str) -> str:
    """The path of ``program``; missing: skip the test (fail it under CI), saying ``install`` fixes it."""
    binary = shutil.which(program)
    if binary is None:
        message = f"{program} is not installed ({install})"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI must not skip tests that need it")
        pytest.skip(message)
    return binary
