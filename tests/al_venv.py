"""A virtualenv of the test's own with Agent Lightning 0.1.2 (from PyPI) and this rollq, for tests
that run AL's real classes and client. Built once per session; a test skips, with the reason, only
when the package cannot be installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AL_REQUIREMENT = "agentlightning==0.1.2"


def build(directory: Path) -> Path:
    """The venv's ``bin`` directory, with ``agentlightning`` 0.1.2 and rollq (editable) installed."""
    venv = directory / "al-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", AL_REQUIREMENT, "-e", str(REPO)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        tail = "\n".join(line for line in pip.stderr.splitlines() if "WARNING: Location" not in line)[-1500:]
        pytest.skip(f"cannot install {AL_REQUIREMENT} into a fresh venv: {tail}")
    return venv / "bin"


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}
