"""The CLI off the happy path: whole-file validation for enqueue, policy flags, new vs known counts, imports from
the current directory, one-line errors with exit 2 (usage) or 1, demo on the global --url, completion."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rollq.ops.cli import main
from rollq.producer import Producer
from rollq.store.records import read_record
from tests.support.servers import ROLLQ, RedisServer


def test_enqueue_checks_every_line_first_and_queues_nothing_naming_the_bad_ones(
    rollq: Callable[..., Result], url: str, namespace: str
) -> None:
    lines = ['{"input": 1}', '{"input": 2}', '{"input": 3, "mode": "training"}', "{oops", '{"input": 5}']

    result = rollq("enqueue", input="\n".join(lines) + "\n")

    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rollq: line 3: mode: Input should be 'train', 'val' or 'test'"), line
    assert line.endswith("(and 1 more bad line(s)); nothing was queued")
    producer = Producer.from_url(url, namespace)
    assert producer.connection.llen(producer.keys.rq_queue) == 0


def test_enqueue_with_an_unknown_pinned_version_on_a_late_line_queues_nothing(
    rollq: Callable[..., Result], url: str, namespace: str
) -> None:
    result = rollq("enqueue", input='{"input": 1}\n{"input": 2, "resources_id": "v7"}\n')

    assert result.exit_code == 1
    assert "v7" in result.stderr and "nothing was queued" in result.stderr
    producer = Producer.from_url(url, namespace)
    assert producer.connection.llen(producer.keys.rq_queue) == 0


def test_enqueue_policy_flags_reach_the_task_and_a_rerun_queues_nothing_twice(
    rollq: Callable[..., Result], url: str, namespace: str
) -> None:
    text = '{"input": 1, "rollout_id": "a"}\n{"input": 2, "rollout_id": "b"}\n'
    flags = ["--timeout", "12.5", "--max-attempts", "5", "--retry-on", "exception", "--retry-on", "timeout"]

    first = rollq("enqueue", *flags, input=text)
    again = rollq("enqueue", *flags, input=text + '{"input": 3, "rollout_id": "c"}\n')

    assert first.exit_code == 0 and again.exit_code == 0, first.stderr + again.stderr
    assert first.stdout.split() == ["a", "b"] and again.stdout.split() == ["a", "b", "c"]
    assert first.stderr.strip().endswith("queued 2 new task(s); 0 already known (not queued again)")
    assert again.stderr.strip().endswith("queued 1 new task(s); 2 already known (not queued again)")
    producer = Producer.from_url(url, namespace)
    policy = read_record(producer.connection, producer.keys, "a").policy
    assert (policy.timeout_seconds, policy.max_attempts, policy.retry_on) == (12.5, 5, {"exception", "timeout"})
    assert producer.connection.llen(producer.keys.rq_queue) == 3


@pytest.mark.parametrize(
    "args, stdin, exit_code, needle",
    [
        (("resources", "set"), "[1, 2]", 1, "resources must be a JSON object"),
        (("resources", "set"), '{"m": {"resource_type": "llm"}}', 1, "m.llm.endpoint: Field required"),
        (("enqueue", "--max-attempts", "0"), "", 2, "--max-attempts"),
        (("status", "--json", "--prometheus"), None, 2, "pick one"),
        (("dead-letter", "requeue", "some-id", "--all"), None, 2, "not both"),
        (("task", "nope"), None, 1, "no task 'nope'"),
        (("rollouts", "get", "nope"), None, 1, "no task 'nope'"),
        (("enqueue", "--timeout", "inf"), '{"input": 1}', 2, "--timeout"),
        (("enqueue",), '{"input": 1, "metadata": {"w": Infinity}}', 1, "metadata['w'] is not a finite number"),
        (("enqueue",), '{"input": ' + "[" * 5000 + "]" * 5000 + "}", 1, "line 1"),
        (("status", "--watch", "-1"), None, 2, "--watch"),
        (("groups", "idle-after", "nan"), None, 2, "SECONDS"),
        (("demo", "--concurrency", "0"), None, 2, "--concurrency"),
        (("demo", "--tasks", "-1"), None, 2, "--tasks"),
        (("metrics", "--port", "99999"), None, 2, "--port"),
        (("dashboard", "--port", "99999"), None, 2, "--port"),
        (("serve-al", "--port", "99999"), None, 2, "--port"),
        (("serve-al", "--lease", "-1"), None, 2, "--lease"),
        (("worker", "--grace-seconds", "inf"), None, 2, "'inf' is not a finite number of seconds"),
        (("worker", "--heartbeat-seconds", "0"), None, 2, "--heartbeat-seconds"),
    ],
)
def test_user_errors_are_one_line_with_exit_1_or_usage_exit_2(
    rollq: Callable[..., Result], args: tuple[str, ...], stdin: str | None, exit_code: int, needle: str
) -> None:
    result = rollq(*args, input=stdin)

    assert result.exit_code == exit_code, result.output
    assert needle in result.stderr
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rollq: "), line


@pytest.mark.parametrize(
    "command, option, value",
    [
        ("serve-al", "--lease", "nan"),
        ("serve-al", "--lease", "inf"),
        ("serve-al", "--heartbeat", "nan"),
        ("serve-al", "--heartbeat", "-1"),
        ("serve-agl", "--lease", "nan"),
        ("serve-agl", "--lease", "inf"),
        ("serve-agl", "--unresponsive-seconds", "nan"),
        ("serve-agl", "--unresponsive-seconds", "-1"),
        ("serve-agl", "--train-temperature", "nan"),
        ("serve-agl", "--val-temperature", "-1"),
    ],
)
def test_the_gateways_refuse_a_float_option_that_is_not_a_finite_number_in_range(
    rollq: Callable[..., Result], command: str, option: str, value: str
) -> None:
    # --host 0.0.0.0 without --key: a gateway that took the value goes on to refuse the host (exit 2 naming --key)
    # instead of serving forever.
    result = rollq(command, option, value, "--host", "0.0.0.0")

    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rollq: ") and option in line and "--key" not in line, line


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("ROLLQ_REDIS_URL", "REDIS_URL", "PYTHONPATH")}


AGENT_MODULE = """
from rollq.worker import LitAgent

class LocalAgent(LitAgent):
    def training_rollout(self, task_input, rollout_id, resources):
        return 0.25

NotAnAgent = dict
"""


@pytest.mark.redis
def test_worker_imports_the_agent_from_the_current_directory_like_rq_worker(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "myagents.py").write_text(AGENT_MODULE)
    producer = Producer.from_url(redis_server.url, namespace)
    rid = producer.enqueue({"n": 1}, mode="train").rollout_id
    base = [ROLLQ, "--url", redis_server.url, "-n", namespace, "worker", "--burst"]

    done = subprocess.run(
        [*base, "--agent", "myagents:LocalAgent"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120
    )
    wrong = subprocess.run(
        [*base, "--agent", "myagents:NotAnAgent"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert producer.wait([rid], timeout=10)[0].final_reward == 0.25
    assert wrong.returncode == 1
    (line,) = [ln for ln in wrong.stderr.splitlines() if ln.startswith("rollq:")]
    assert line == (
        "rollq: the agent must be a rollq.worker.LitAgent or an agentlightning.LitAgent (an @rollout function is one), "
        "got dict"
    )
    assert "Traceback" not in wrong.stderr


@pytest.mark.redis
def test_demo_runs_on_the_global_url_and_says_where(redis_server: RedisServer) -> None:
    done = subprocess.run(
        [
            ROLLQ,
            "--url",
            redis_server.url,
            "-n",
            "demo-here",
            "demo",
            "--tasks",
            "8",
            "--workers",
            "1",
            "--concurrency",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == f"Redis: {redis_server.url}"
    assert "embedded" not in done.stdout
    assert "rollouts   8 of 8 tasks" in done.stdout
    assert len(list(redis_server.client().scan_iter("{demo-here}:task:*"))) == 8  # -n given: that namespace


def test_demo_without_a_url_says_it_uses_the_embedded_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str | None] = []
    import rollq.ops.demo as demo

    def fake_run_demo(url: str | None, **kwargs: object) -> object:
        calls.append(url)
        raise SystemExit(0)

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    for name in ("ROLLQ_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)

    CliRunner().invoke(main, ["demo"])
    CliRunner().invoke(main, ["--url", "memory://", "demo"])

    assert calls == [None, None]  # None: run_demo starts the embedded server and prints "(embedded fake Redis)"


def test_shell_completion_is_documented_and_works() -> None:
    done = subprocess.run(
        [ROLLQ],
        env={**_env(), "_ROLLQ_COMPLETE": "bash_source"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    words = subprocess.run(
        [ROLLQ],
        env={**_env(), "_ROLLQ_COMPLETE": "bash_complete", "COMP_WORDS": "rollq dead", "COMP_CWORD": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0 and "_rollq_completion" in done.stdout
    assert "plain,dead-letter" in words.stdout.split()
    assert "_ROLLQ_COMPLETE=bash_source rollq" in CliRunner().invoke(main, ["--help"]).output
    operations = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert "_ROLLQ_COMPLETE=bash_source rollq" in operations
