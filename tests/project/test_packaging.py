"""The wheel and the sdist hold every module, Lua script and template of the package (a checkout without
symlinks once built a wheel of 2 files): built here from this checkout, without build isolation."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DATA = ("*.py", "*.lua", "*.html", "py.typed")

pytestmark = pytest.mark.slow


def _package_files() -> set[str]:
    found = {
        path.relative_to(REPO).as_posix()
        for pattern in PACKAGE_DATA
        for path in (REPO / "rollq").rglob(pattern)
        if "__pycache__" not in path.parts
    }
    assert len(found) > 100 and any(f.endswith(".lua") for f in found) and any(f.endswith(".html") for f in found)
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("rollq-*.whl")
    (sdist,) = out.glob("rollq-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_holds_every_module_lua_script_and_template(built: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    missing = _package_files() - names
    assert not missing, sorted(missing)[:20]
    assert not any(name.startswith(("tests/", "bench/", "examples/")) for name in names)
    assert any(name.endswith("licenses/LICENSE") for name in names)


def test_the_sdist_holds_every_module_lua_script_and_template(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = _package_files() - names
    assert not missing, sorted(missing)[:20]
    assert {"pyproject.toml", "README.md", "LICENSE"} <= names
