"""Who may reach ``rollq dashboard`` and ``rollq metrics``: a token when one is set, loopback only without one,
and a clear line (no traceback) when the port is taken."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.support.servers import REPO, ROLLQ, RedisServer, free_port

TOKEN = "s3cret-token"


def _status(url: str, header: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _serve(args: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([ROLLQ, *args, "--port", str(port)], env={**os.environ, **env}, cwd=REPO)
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"{args} exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            assert time.monotonic() < deadline, f"{args} did not listen"
            time.sleep(0.1)


def _basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"anyone:{password}".encode()).decode()


@pytest.mark.redis
@pytest.mark.parametrize("command", ["dashboard", "metrics"])
def test_with_a_token_every_page_and_metrics_need_it(redis_server: RedisServer, command: str) -> None:
    port = free_port()
    env = {"ROLLQ_REDIS_URL": redis_server.url, "ROLLQ_DASHBOARD_TOKEN": TOKEN}
    process = _serve([command], env, port)
    try:
        base = f"http://127.0.0.1:{port}"
        paths = ["/metrics"] + (["/rollq/", "/rollq/api/rollouts", "/"] if command == "dashboard" else [])
        for path in paths:
            assert _status(base + path) == 401, path
            assert _status(base + path, _basic("wrong")) == 401, path
            assert _status(base + path, "Bearer wrong") == 401, path
            assert _status(base + path, _basic(TOKEN)) == 200, path
            assert _status(base + path, f"Bearer {TOKEN}") == 200, path
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("command", ["dashboard", "metrics"])
def test_a_non_loopback_bind_without_a_token_is_refused_in_one_line(command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROLLQ_DASHBOARD_TOKEN"}
    done = subprocess.run(
        [ROLLQ, command, "--bind", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to serve" in lines[0] and "ROLLQ_DASHBOARD_TOKEN" in lines[0], done.stderr
    # Each says what it would give away: the dashboard can requeue, /metrics only tells how runs go.
    assert ("requeue" in lines[0]) == (command == "dashboard"), lines[0]


@pytest.mark.redis
@pytest.mark.parametrize("command", ["dashboard", "metrics", "serve-al"])
def test_a_busy_port_is_one_line_not_a_traceback(redis_server: RedisServer, command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [ROLLQ, "--url", redis_server.url, command, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is already in use" in lines[0], done.stderr
