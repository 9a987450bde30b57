"""``rollq dashboard`` in a subprocess, as an operator starts it."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.servers import REPO, ROLLQ, free_port
from tests.support.waiting import wait_until

SCREENSHOTS = REPO / "docs" / "screenshots"


class Dashboard:
    """``rollq dashboard`` in a subprocess, with the Redis URL (and its password) passed in the environment."""

    def __init__(self, redis_url: str, log_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115  # closed in stop()
        env = {**os.environ, "ROLLQ_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [ROLLQ, "dashboard", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        wait_until(self._answers, f"rq-dashboard on port {self.port} (log: {log_path})", timeout=60)

    def _answers(self) -> bool:
        assert self.process.poll() is None, f"rollq dashboard exited: {self.log()}"
        try:
            with urllib.request.urlopen(self.base + "/", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
