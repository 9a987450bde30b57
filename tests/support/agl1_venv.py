"""A virtualenv of the test's own with Agent Lightning 1.0.2 (from PyPI), numpy and this rollq.

AL 1.0.2 declares Python >= 3.12: the venv is built with a 3.12+ interpreter when the machine has one
(``python3.12``/``python3.13`` on PATH or under pyenv); on a 3.11-only machine AL is installed with
``--ignore-requires-python --no-deps`` plus its declared dependencies. Built once per session; a test
skips, with the reason, only when the packages cannot be installed (fails under CI).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGL_REQUIREMENT = "agentlightning==1.0.2"
# What agentlightning 1.0.2 declares (for the 3.11 route), plus numpy for its VERL rollout manager and the
# openai SDK for the example agent.
AGL_DEPENDENCIES = [
    "fastapi>=0.115.0",
    "uvicorn>=0.34.0",
    "pydantic>=2.10.0",
    "httpx>=0.28.0",
    "httpx-retries>=0.4.0",
    "hydra-core==1.3.2",
    "omegaconf==2.3.0",
    "structlog>=24.4.0",
    "jinja2>=3.1.6",
    "kr8s>=0.18.0",
    "pyyaml>=6.0.3",
]
EXTRAS = ["numpy", "openai>=1.40"]


def interpreter() -> tuple[str, bool]:
    """A Python for the venv and whether it is >= 3.12 (else AL goes in without its Python check)."""
    candidates = [shutil.which(name) for name in ("python3.12", "python3.13")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python")))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate, True
    return sys.executable, False


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def build(directory: Path) -> Path:
    """The venv's ``bin`` directory, with agentlightning 1.0.2 and rollq (editable) installed."""
    python, modern = interpreter()
    venv = directory / "agl1-venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    steps = (
        [[*pip, AGL_REQUIREMENT, *EXTRAS, "-e", str(REPO)]]
        if modern
        else [
            [*pip, *AGL_DEPENDENCIES, *EXTRAS, "-e", str(REPO)],
            [*pip, "--ignore-requires-python", "--no-deps", AGL_REQUIREMENT],
        ]
    )
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = "\n".join(line for line in done.stderr.splitlines() if "WARNING: Location" not in line)[-1500:]
            _fail_or_skip(f"cannot install {AGL_REQUIREMENT} into a fresh venv ({python}): {tail}")
    return venv / "bin"
