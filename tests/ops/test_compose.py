"""compose.yaml: Redis with AOF and a password, scalable workers, a loopback-only dashboard, a sample producer."""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from rollq.models.policy import RolloutPolicy
from rollq.worker.agent import LitAgent
from rollq.worker.loader import load_object
from tests.support.doc_blocks import DOCS, section
from tests.support.servers import REPO, ROLLQ, RedisServer, WorkerProcess, free_port

COMPOSE = REPO / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
REDIS_CLIENTS = ("worker", "dashboard", "producer")


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


class MissingVariable(Exception):
    """What compose stops with for ``${VAR:?message}`` when VAR is unset or empty."""


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` substitution, enough for this file."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.group(1), match.group(3), match.group(4) or ""
        if env.get(name):
            return env[name]
        if kind == "?":
            raise MissingVariable(f"{name}: {rest}")
        return rest

    return re.sub(r"\$\{(\w+)(:([-?])((?:[^{}]|\$\([^)]*\))*))?\}", one, value)


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
    assert interpolate(arg_after(command, "--requirepass"), {"REDIS_PASSWORD": "x"}) == "x"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "ports" not in redis  # reached over the compose network only


def test_every_redis_client_gets_a_url_with_the_server_password(services: dict[str, Any]) -> None:
    env = {"REDIS_PASSWORD": "0123abcd"}
    password = interpolate(arg_after(services["redis"]["command"], "--requirepass"), env)

    assert password == "0123abcd"
    for name in REDIS_CLIENTS:
        url = urlsplit(interpolate(services[name]["environment"]["ROLLQ_REDIS_URL"], env))
        assert (url.scheme, url.hostname, url.password) == ("redis", "redis", password), name
    assert interpolate(services["redis"]["environment"]["REDISCLI_AUTH"], env) == password


def test_without_redis_password_compose_refuses_instead_of_defaulting(services: dict[str, Any]) -> None:
    places = [
        arg_after(services["redis"]["command"], "--requirepass"),
        services["redis"]["environment"]["REDISCLI_AUTH"],
    ]
    places += [services[name]["environment"]["ROLLQ_REDIS_URL"] for name in REDIS_CLIENTS]

    for place in places:
        assert "${REDIS_PASSWORD:?" in place, place
        with pytest.raises(MissingVariable, match="REDIS_PASSWORD"):
            interpolate(place, {})
    assert "change-me" not in COMPOSE.read_text()


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


@pytest.mark.redis
def test_the_dashboard_service_starts_with_its_compose_environment_and_asks_for_the_token(
    services: dict[str, Any], redis_server: RedisServer
) -> None:
    # The compose command binds 0.0.0.0 (Docker forwards to it), which rollq refuses without a token: the service
    # must carry one, or it exits at once and restarts forever.
    password = "a-redis-password"
    service = services["dashboard"]
    env = {
        name: interpolate(str(value), {"REDIS_PASSWORD": password}) for name, value in service["environment"].items()
    }
    env["ROLLQ_REDIS_URL"] = redis_server.url  # the compose network's redis:6379, here a private server
    command = list(service["command"])
    port = free_port()
    command[command.index("--port") + 1] = str(port)
    command[0] = ROLLQ  # the image's rollq on its PATH; this checkout's here
    process = subprocess.Popen(command, env={**os.environ, **env}, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"the dashboard service exited {process.returncode}: {process.communicate()[1][-1000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard did not listen"
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/rollq/"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 401
        login = base64.b64encode(f"me:{password}".encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {login}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_image_is_built_once_and_every_service_runs_it(services: dict[str, Any]) -> None:
    built = [name for name, service in services.items() if "build" in service]

    assert built == ["worker"] and services["worker"]["build"] == "." and services["worker"]["image"] == "rollq"
    for name in ("dashboard", "producer"):
        assert services[name]["image"] == "rollq" and services[name]["pull_policy"] == "never", name


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, args = line.partition(" ")
            pairs.append((instruction.upper(), args.strip()))
    return pairs


DOCKERFILE_INSTRUCTIONS = {
    "FROM",
    "RUN",
    "COPY",
    "ADD",
    "ENV",
    "WORKDIR",
    "USER",
    "CMD",
    "ENTRYPOINT",
    "HEALTHCHECK",
    "ARG",
    "LABEL",
    "EXPOSE",
}


def test_dockerfile_installs_dependencies_before_sources_and_has_a_healthcheck() -> None:
    steps = dockerfile_instructions(DOCKERFILE.read_text())
    copies = [(i, args.split()[0]) for i, (kind, args) in enumerate(steps) if kind == "COPY"]
    installs = [i for i, (kind, args) in enumerate(steps) if kind == "RUN" and "pip install" in args]
    first_source = min(i for i, source in copies if source not in ("pyproject.toml",))

    assert {kind for kind, _ in steps} <= DOCKERFILE_INSTRUCTIONS
    assert installs[0] < first_source, "dependencies must be installed before any source is copied"
    assert "-r /tmp/requirements.txt" in steps[installs[0]][1]
    assert "--no-deps" in steps[installs[-1]][1] and "[dashboard]" in steps[installs[-1]][1]
    # The package is copied whole, and every source exists.
    assert "rollq" in {source for _, source in copies}
    assert all((REPO / source).exists() for _, source in copies)
    (healthcheck,) = [args for kind, args in steps if kind == "HEALTHCHECK"]
    assert "CMD rollq status" in healthcheck and "--timeout=" in healthcheck


def docs_agent_dockerfile() -> str:
    text = section(DOCS / "operations.md", "## Docker and compose")
    match = re.search(r"```dockerfile\n(FROM rollq\n.*?)```", text, flags=re.S)
    assert match is not None, "docs/operations.md shows a Dockerfile FROM rollq"
    return match.group(1)


def test_operations_doc_shows_an_agent_image_built_from_the_rollq_image(tmp_path: Path) -> None:
    # No Docker engine here: the file is written and checked as a build would read it.
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(docs_agent_dockerfile())
    steps = dockerfile_instructions(dockerfile.read_text())

    assert steps[0] == ("FROM", "rollq")
    assert {kind for kind, _ in steps} <= DOCKERFILE_INSTRUCTIONS
    assert any(kind == "RUN" and "pip install" in args for kind, args in steps)
    (agent,) = [args.split("=", 1)[1] for kind, args in steps if kind == "ENV" and args.startswith("ROLLQ_AGENT=")]
    assert re.fullmatch(r"[\w.]+:\w+", agent)
    assert services_image_name() == "rollq"


def test_operations_doc_agent_dockerfile_installs_as_root_and_runs_as_the_rollq_user() -> None:
    # The rollq image ends with `USER rollq`: a `pip install /agent` run as that user got "Permission denied".
    (base_user,) = [args for kind, args in dockerfile_instructions(DOCKERFILE.read_text()) if kind == "USER"][-1:]
    user = base_user
    for kind, args in dockerfile_instructions(docs_agent_dockerfile()):
        if kind == "USER":
            user = args
        if kind == "RUN" and "pip install" in args:
            assert user == "root", f"`{args}` runs as {user!r}, which cannot write to site-packages"
    assert user == base_user == "rollq", "the agent image must run as the unprivileged rollq user again"


def services_image_name() -> str:
    return str(yaml.safe_load(COMPOSE.read_text())["services"]["worker"]["image"])


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
