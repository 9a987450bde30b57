"""compose.yaml: Redis with AOF and a password, scalable workers, a loopback-only dashboard, a sample producer."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from servers import REPO, RedisServer, WorkerProcess

from rollq.models.policy import RolloutPolicy
from rollq.worker.agent import LitAgent
from rollq.worker.loader import load_object

COMPOSE = REPO / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
REDIS_CLIENTS = ("worker", "dashboard", "producer")


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` and ``${VAR:-default}`` substitution, enough for this file."""

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3) or ""
        return env.get(name) or default

    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", one, value)


def seconds(duration: str) -> float:
    """A compose duration such as ``345s``, ``5m45s`` or ``1h``."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert match and duration, f"not a duration: {duration!r}"
    hours, minutes, secs = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + secs


def arg_after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_compose_has_redis_workers_dashboard_and_a_sample_producer(services: dict[str, Any]) -> None:
    assert set(services) >= {"redis", "worker", "dashboard", "producer"}


def test_redis_persists_with_aof_on_a_volume_and_requires_a_password(services: dict[str, Any]) -> None:
    redis = services["redis"]
    command = redis["command"]

    assert redis["image"].split(":")[-1].startswith("7")
    assert arg_after(command, "--appendonly") == "yes"
    assert interpolate(arg_after(command, "--requirepass"), {}) != ""
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "ports" not in redis  # reached over the compose network only


@pytest.mark.parametrize("password_env", [{}, {"REDIS_PASSWORD": "0123abcd"}], ids=["default", "from-env"])
def test_every_redis_client_gets_a_url_with_the_server_password(
    services: dict[str, Any], password_env: dict[str, str]
) -> None:
    password = interpolate(arg_after(services["redis"]["command"], "--requirepass"), password_env)

    for name in REDIS_CLIENTS:
        url = urlsplit(interpolate(services[name]["environment"]["ROLLQ_REDIS_URL"], password_env))
        assert (url.scheme, url.hostname, url.password) == ("redis", "redis", password), name
    assert interpolate(services["redis"]["environment"]["REDISCLI_AUTH"], password_env) == password


def test_workers_scale_and_drain_for_longer_than_a_rollout_may_run(services: dict[str, Any]) -> None:
    worker = services["worker"]
    grace = float(worker["environment"]["ROLLQ_GRACE_SECONDS"])

    # --scale worker=N needs both absent: one container name, one host port.
    assert "container_name" not in worker and "ports" not in worker
    assert grace >= RolloutPolicy().timeout_seconds
    # The worker hands unfinished rollouts back for up to 30 s after the grace period.
    assert seconds(worker["stop_grace_period"]) > grace + 30
    assert worker["command"][:2] == ["rollq", "worker"]


def test_worker_agent_is_importable_from_the_installed_package(services: dict[str, Any]) -> None:
    assert isinstance(load_object(services["worker"]["environment"]["ROLLQ_AGENT"]), LitAgent)


def test_only_the_dashboard_publishes_a_port_and_only_on_loopback(services: dict[str, Any]) -> None:
    published = {name: service["ports"] for name, service in services.items() if "ports" in service}
    command = services["dashboard"]["command"]

    assert list(published) == ["dashboard"]
    for port in published["dashboard"]:
        host_ip = port["host_ip"] if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", port
    assert command[:2] == ["rollq", "dashboard"] and arg_after(command, "--bind") == "0.0.0.0"


def test_the_image_compose_builds_installs_rollq_from_files_in_the_repo(services: dict[str, Any]) -> None:
    built = [name for name, service in services.items() if "build" in service]
    lines = DOCKERFILE.read_text().splitlines()
    sources = [part for line in lines if line.startswith("COPY ") for part in line.split()[1:-1]]

    assert {"worker", "dashboard", "producer"} <= set(built)
    assert all(services[name]["build"] == "." for name in built)
    assert all((REPO / source).exists() for source in sources), sources
    assert any(line.startswith("RUN pip install") and "[dashboard]" in line for line in lines)


@pytest.mark.redis
def test_sample_producer_gets_every_rollout_back_from_a_worker(
    redis_server: RedisServer,
    namespace: str,
    workers: Callable[..., WorkerProcess],
    services: dict[str, Any],
) -> None:
    worker = workers(
        redis_server.url,
        namespace,
        env={
            "ROLLQ_AGENT": services["worker"]["environment"]["ROLLQ_AGENT"],
            "ROLLQ_CONCURRENCY": "8",
        },
    )
    env = {**os.environ, "ROLLQ_REDIS_URL": redis_server.url, "ROLLQ_NAMESPACE": namespace}

    sample = subprocess.Popen(
        [sys.executable, "examples/sample_producer.py", "--tasks", "20", "--timeout", "120"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while sample.poll() is None:
        if worker.process.poll() is not None:
            sample.kill()
            pytest.fail(f"the worker exited: {worker.log()[-2000:]}")
        time.sleep(0.1)
    stdout, stderr = sample.communicate()

    assert sample.returncode == 0, stderr
    assert "20 rollouts back: 20 succeeded" in stdout


def docker_compose_unavailable() -> str | None:
    """Why ``docker compose config`` cannot run here, or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine is reachable (`docker info` failed)"
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode != 0:
        return "the docker compose plugin is not installed"
    return None


def test_docker_compose_accepts_the_file() -> None:
    reason = docker_compose_unavailable()
    if reason:
        pytest.skip(reason)

    done = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        cwd=REPO,
        env={**os.environ, "REDIS_PASSWORD": "0123abcd"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
