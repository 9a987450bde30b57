"""The README's first command: ``rollq demo`` runs a whole round on an embedded Redis, from any directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.servers import ROLLQ


def test_rollq_demo_runs_every_task_from_a_directory_outside_the_repository(tmp_path: Path) -> None:
    done = subprocess.run(
        [ROLLQ, "demo", "--tasks", "24", "--workers", "2", "--concurrency", "4", "--timeout", "120"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollouts   24 of 24 tasks (24 succeeded, 0 failed)" in done.stdout
