"""Virtualenvs of the tests' own with a real Agent Lightning release (from PyPI) and this rollq (editable).

Each release gets its own venv (0.1.2, 0.2.2 and 0.3.0 cannot share one: their AgentOps, OpenTelemetry and
pydantic pins differ), built by the first test that needs it and kept in a cache directory under /tmp, keyed
by the release, the Python version, this checkout's path and rollq's declared dependencies (rollq is
installed editable, so code changes need no rebuild; a dependency change makes a new key). A file lock lets two test
sessions share a cache; a half-built venv is never used (it is built aside and renamed into place).

When pip cannot install a release the test skips with pip's reason, except under ``CI=true``, where it fails:
CI must not pass without having run the real packages.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ROLLQ_TEST_VENV_CACHE", "/tmp/rollq-test-venvs"))
RELEASES = ("0.1.2", "0.2.2", "0.3.0")


def _key(version: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"{version}|{sys.version_info[:2]}|{REPO}".encode())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    digest.update(repr(sorted(project["dependencies"])).encode())
    return f"agentlightning-{version}-{digest.hexdigest()[:12]}"


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message + "; CI must not skip the tests with the real Agent Lightning")
    pytest.skip(message)


def build(version: str = "0.1.2") -> Path:
    """The ``bin`` directory of a venv with ``agentlightning==version`` and rollq (editable), built if needed."""
    CACHE.mkdir(parents=True, exist_ok=True)
    venv = CACHE / _key(version)
    with (CACHE / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / "ready").exists():
            return venv / "bin"
        partial = CACHE / f"{venv.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
        pip = subprocess.run(
            [str(partial / "bin" / "pip"), "install", "-q", f"agentlightning=={version}", "-e", str(REPO)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if pip.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            tail = "\n".join(line for line in pip.stderr.splitlines() if "WARNING: Location" not in line)[-1500:]
            _unavailable(f"cannot install agentlightning=={version} into a fresh venv: {tail}")
        # A venv's scripts name its absolute path: build it where it will live.
        shutil.rmtree(venv, ignore_errors=True)
        partial.rename(venv)
        _fix_paths(partial, venv)
        (venv / "ready").write_text(version)
        return venv / "bin"


def _fix_paths(old: Path, new: Path) -> None:
    """Point the moved venv's scripts and config at its final place."""
    for path in [*(new / "bin").iterdir(), new / "pyvenv.cfg"]:
        if path.is_file() and not path.is_symlink():
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            if str(old) in text:
                path.write_text(text.replace(str(old), str(new)))


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}
