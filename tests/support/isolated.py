"""Run a shell script in a network namespace of its own, where localhost is the script's alone.

Tests of rollq's default URL (redis://localhost:6379/0) must not reach the
machine's own Redis on 6379: inside ``unshare --net`` nothing listens on
localhost unless the script starts it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import REPO, require_redis_server

BIN = Path(sys.executable).parent


def require_unshare() -> str:
    binary = shutil.which("unshare")
    ok = binary is not None and subprocess.run([binary, "--net", "true"], capture_output=True).returncode == 0
    if not ok:
        message = "needs `unshare --net` (root, util-linux) to keep localhost:6379 private"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI must not skip it")
        pytest.skip(message)
    assert binary is not None
    return binary


PRELUDE = """
set -e
ip link set lo up
start_redis() {  # start_redis PORT [PASSWORD]
  dir=$(mktemp -d)
  if [ -n "$2" ]; then auth="--requirepass $2"; else auth=""; fi
  redis-server --port "$1" --bind 127.0.0.1 --save '' --dir "$dir" --logfile "$dir/log" $auth &
  for _ in $(seq 100); do
    redis-cli -p "$1" ${2:+-a "$2" --no-auth-warning} ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "redis-server on $1 did not start" >&2; return 1
}
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
"""


def run_isolated(
    script: str, *, cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``script`` (bash) in a fresh network namespace, with the venv's commands on PATH and no Redis URL set."""
    unshare = require_unshare()
    require_redis_server()
    base = {k: v for k, v in os.environ.items() if k not in ("ROLLQ_REDIS_URL", "REDIS_URL", "RQ_REDIS_URL")}
    full_env = {**base, "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [unshare, "--net", "bash", "-c", PRELUDE + script],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=timeout,
    )
