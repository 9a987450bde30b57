"""Worker settings are one pydantic-settings model: ROLLQ_* variables and .env, typed one-line errors,
a warning naming the closest known variable for a typo, and JSON logs on request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollq.worker.config import InvalidSettingError, WorkerSettings, warn_unknown
from tests.support.servers import REPO, ROLLQ, RedisServer


def test_fields_and_defaults_are_kept() -> None:
    settings = WorkerSettings.from_env({})

    assert (settings.agent, settings.hooks, settings.concurrency, settings.grace_seconds) == ("", (), 1, 30.0)
    assert (settings.heartbeat_seconds, settings.results_maxlen, settings.max_result_bytes) == (5.0, 100_000, 8 << 20)
    assert (settings.keep_seconds, settings.result_ttl, settings.log_format) == (3600, 3600, "text")


def test_environment_then_overrides_with_comma_separated_hooks() -> None:
    env = {"ROLLQ_CONCURRENCY": "8", "ROLLQ_HOOKS": "a.b:C, d.e:F", "ROLLQ_GRACE_SECONDS": "2.5"}

    settings = WorkerSettings.from_env(env, concurrency=16, agent=None)

    assert (settings.concurrency, settings.hooks, settings.grace_seconds) == (16, ("a.b:C", "d.e:F"), 2.5)


def test_process_environment_and_dotenv_file_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("ROLLQ_AGENT=pkg.mod:Agent\nROLLQ_CONCURRENCY=3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROLLQ_CONCURRENCY", raising=False)
    monkeypatch.setenv("ROLLQ_AGENT", "from.env:Wins")

    settings = WorkerSettings.from_env()

    assert (settings.agent, settings.concurrency) == ("from.env:Wins", 3)


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"ROLLQ_CONCURRENCY": "lots"}, "ROLLQ_CONCURRENCY='lots': Input should be a valid integer"),
        ({"ROLLQ_CONCURRENCY": "0"}, "ROLLQ_CONCURRENCY='0': Input should be greater than or equal to 1"),
        ({"ROLLQ_RESULT_TTL": str(30 * 24 * 3600)}, "ROLLQ_RESULT_TTL"),
        ({"ROLLQ_LOG_FORMAT": "xml"}, "ROLLQ_LOG_FORMAT='xml'"),
        ({"ROLLQ_ROLLOUT_TRACE": "some"}, "ROLLQ_ROLLOUT_TRACE='some': Input should be 'all', 'failed' or 'none'"),
        # an infinite grace or heartbeat would never end a shutdown or never beat (the audit's rollq worker flags)
        ({"ROLLQ_GRACE_SECONDS": "inf"}, "ROLLQ_GRACE_SECONDS='inf': Input should be a finite number"),
        ({"ROLLQ_HEARTBEAT_SECONDS": "inf"}, "ROLLQ_HEARTBEAT_SECONDS='inf': Input should be a finite number"),
        (
            {"ROLLQ_LLM_PAUSE_WAIT_SECONDS": "nan"},
            "ROLLQ_LLM_PAUSE_WAIT_SECONDS='nan': Input should be a finite number",
        ),
    ],
)
def test_bad_values_are_a_typed_error_naming_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidSettingError) as raised:
        WorkerSettings.from_env(env)

    assert needle in str(raised.value) and "\n" not in str(raised.value)


def test_an_unknown_rollq_variable_warns_naming_the_closest_known_one(caplog: pytest.LogCaptureFixture) -> None:
    unknown = warn_unknown({"ROLLQ_CONCURENCY_X": "4", "ROLLQ_AGENT": "a:b", "ROLLQ_TEST_ANYTHING": "1"})

    assert unknown == ["ROLLQ_CONCURENCY_X"]
    assert "unknown setting ROLLQ_CONCURENCY_X is ignored; did you mean ROLLQ_CONCURRENCY?" in caplog.text


def _rollq(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ROLLQ, *args], capture_output=True, text=True, timeout=60, env=env)


def test_a_typo_reaches_the_user_of_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    env = {**os.environ, "ROLLQ_CONCURENCY": "4"}

    done = _rollq("--url", "memory://", "resources", "list", env=env)

    assert done.returncode == 0, done.stderr
    assert "unknown setting ROLLQ_CONCURENCY is ignored; did you mean ROLLQ_CONCURRENCY?" in done.stderr


def test_a_bad_worker_setting_is_one_line_exit_1() -> None:
    import os

    env = {**os.environ, "ROLLQ_CONCURRENCY": "many", "ROLLQ_AGENT": "rollq.worker.sample_agent:SampleAgent"}

    done = _rollq("--url", "memory://", "worker", "--burst", env=env)

    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rollq: invalid setting ROLLQ_CONCURRENCY='many'"), done.stderr


def test_json_log_format_writes_one_json_object_per_line() -> None:
    import os

    env = {**os.environ, "ROLLQ_LOG_FORMAT": "json"}

    done = _rollq("--url", "memory://", "--log-level", "INFO", "resources", "list", env=env)

    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r["message"] == "Redis at memory://" and r["level"] == "INFO" for r in records), records


@pytest.mark.redis
def test_stock_rq_worker_logs_json_with_rollq_log_format(redis_server: RedisServer, namespace: str) -> None:
    env = {
        **os.environ,
        "ROLLQ_LOG_FORMAT": "json",
        "ROLLQ_AGENT": "rollq.worker.sample_agent:SampleAgent",
        "PYTHONPATH": str(REPO),
    }
    rq = str(Path(sys.executable).parent / "rq")

    done = subprocess.run(
        [rq, "worker", "-w", "rollq.worker.RolloutWorker", "--url", redis_server.url, "--burst", namespace],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )

    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert any(
        r["message"].startswith("rollq worker") and "Redis at redis://127.0.0.1:" in r["message"] for r in records
    )


def _clean_env(**extra: str) -> dict[str, str]:
    """The process environment without any Redis URL or namespace of its own (only .env and ``extra`` count)."""
    drop = ("ROLLQ_REDIS_URL", "REDIS_URL", "ROLLQ_NAMESPACE", "RQ_REDIS_URL")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _status_in(directory: Path, *args: str, **env: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [ROLLQ, *args, "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=directory,
        env=_clean_env(**env),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.redis
def test_redis_url_and_namespace_in_dotenv_reach_every_command_flags_then_environment_then_dotenv(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    from rollq.producer import Producer

    Producer.from_url(redis_server.url, namespace).enqueue({"q": 1})
    # Before: .env's ROLLQ_REDIS_URL and ROLLQ_NAMESPACE were ignored by every command (localhost:6379, 'rollq').
    (tmp_path / ".env").write_text(f"ROLLQ_REDIS_URL={redis_server.url}\nROLLQ_NAMESPACE={namespace}\n")

    from_dotenv = _status_in(tmp_path)
    assert (from_dotenv["namespace"], from_dotenv["queued"]) == (namespace, 1)
    assert _status_in(tmp_path, ROLLQ_NAMESPACE="from-env")["namespace"] == "from-env"
    assert _status_in(tmp_path, "-n", "from-flag", ROLLQ_NAMESPACE="from-env")["namespace"] == "from-flag"


@pytest.mark.redis
def test_a_worker_started_in_a_directory_with_dotenv_uses_its_redis_and_namespace(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    from rollq.producer import Producer

    producer = Producer.from_url(redis_server.url, namespace)
    rid = producer.enqueue({"q": 1}).rollout_id
    (tmp_path / ".env").write_text(
        f"ROLLQ_REDIS_URL={redis_server.url}\nROLLQ_NAMESPACE={namespace}\n"
        "ROLLQ_AGENT=rollq.worker.sample_agent:SampleAgent\n"
    )
    done = subprocess.run(
        [ROLLQ, "worker", "--burst"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_clean_env()
    )
    assert done.returncode == 0, done.stderr
    # The worker found the task on .env's Redis and namespace and ran it (the sample agent's verdict aside).
    assert producer.wait([rid], timeout=10)[0].metadata["attempt"] == 1


def test_a_typo_in_dotenv_is_warned_about_with_the_closest_name(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("ROLLQ_NAMESPAC=oops\n")
    done = subprocess.run(
        [ROLLQ, "--url", "memory://", "resources", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "unknown setting ROLLQ_NAMESPAC is ignored; did you mean ROLLQ_NAMESPACE?" in done.stderr
