"""Every benchmark a reader may run answers ``--help`` with its usage, and does nothing else.

``bench/al_side.py`` is left out: it runs inside an Agent Lightning venv (``bench/al.py`` starts it there).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IN_ANOTHER_VENV = {"al_side.py"}
SCRIPTS = sorted(
    p.name
    for p in (ROOT / "bench").glob("*.py")
    if 'if __name__ == "__main__":' in p.read_text() and p.name not in IN_ANOTHER_VENV
)


def test_the_bench_folder_has_scripts_to_check():
    assert len(SCRIPTS) > 20


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_answers_help_with_its_usage_and_writes_nothing(script):
    watched = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "bench" / "results").glob("*.json"))]
    before = [p.stat().st_mtime_ns for p in watched]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
    assert [p.stat().st_mtime_ns for p in watched] == before
