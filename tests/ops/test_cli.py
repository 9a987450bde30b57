"""The ``rollq`` CLI: help everywhere, one-line errors with meaningful exit codes, and each command's round trip.

Most tests run the CLI in-process (click's CliRunner) on a ``memory://`` Redis
that a Producer in the test shares; those that need the installed entry point
run it as a subprocess against a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

from rollq.models.contract import NamedResources, Rollout
from rollq.ops.cli import main
from rollq.producer import Producer
from rollq.producer.aio import AsyncProducer
from rollq.store.connection import connect
from rollq.worker.agent import LitAgent
from rollq.worker.config import WorkerSettings
from rollq.worker.rq_worker import RolloutWorker
from tests.support.servers import ROLLQ, RedisServer, free_port

PASSWORD = "cli-test-secret"
# One Prometheus sample: name, optional labels, value.
PROMETHEUS_SAMPLE = re.compile(
    r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="[^"]*",?)*\})? (-?[0-9.]+(e[+-]?[0-9]+)?|[+-]Inf|NaN)'
)


class FailOnRequestAgent(LitAgent):
    """Rewards 1.0, or raises when the input asks it to (agent exceptions are not retried by default)."""

    def training_rollout(self, task_input: Any, rollout_id: str, resources: NamedResources) -> float:
        if task_input.get("fail"):
            raise RuntimeError(f"asked to fail {rollout_id}")
        return 1.0


@pytest.fixture
def run_worker(url: str, namespace: str) -> Callable[[], None]:
    """Run a RolloutWorker in this process until the queue is empty."""

    def run() -> None:
        worker = RolloutWorker(
            [namespace], connection=connect(url), agent=FailOnRequestAgent(), settings=WorkerSettings(concurrency=2)
        )
        worker.work(burst=True, logging_level="WARNING")

    return run


def one_line_error(result: Result) -> str:
    """The error line of a failed command, checking that it is one line and not a traceback."""
    assert isinstance(result.exception, SystemExit) or result.exception is None, result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rollq: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


ALL_COMMANDS = list(commands(main))


def test_installed_rollq_entry_point_prints_help() -> None:
    done = subprocess.run([ROLLQ, "--help"], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert "Usage: rollq" in done.stdout


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=[" ".join(c) for c in ALL_COMMANDS])
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"], prog_name="rollq")

    assert result.exit_code == 0, result.output
    assert f"Usage: rollq {' '.join(command)}" in result.output


def test_commands_cover_what_operators_need() -> None:
    assert set(ALL_COMMANDS) >= {
        ("demo",),
        ("worker",),
        ("enqueue",),
        ("resources", "set"),
        ("resources", "get"),
        ("resources", "list"),
        ("status",),
        ("rollouts", "tail"),
        ("dead-letter", "list"),
        ("dead-letter", "requeue"),
        ("dashboard",),
    }


def test_unsupported_url_scheme_is_one_line_exit_1_without_the_password(rollq: Callable[..., Result]) -> None:
    result = rollq("status", url_=f"http://:{PASSWORD}@127.0.0.1:6379/0")

    assert result.exit_code == 1
    line = one_line_error(result)
    assert "scheme" in line and PASSWORD not in line


@pytest.mark.redis
def test_unreachable_redis_is_one_line_exit_3_without_the_password() -> None:
    # A subprocess, so the line checked is all a user would see on the terminal.
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"

    done = subprocess.run([ROLLQ, "--url", url, "status"], capture_output=True, text=True, timeout=120)

    assert done.returncode == 3
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rollq: cannot reach Redis at redis://:***@127.0.0.1:") and PASSWORD not in line


def test_bad_jsonl_line_is_one_line_naming_it_and_queues_nothing(
    rollq: Callable[..., Result], producer: Producer
) -> None:
    result = rollq("enqueue", input='{"input": {"q": 1}}\n\n{"input": {"q": 2}}\nnot json\n')

    assert result.exit_code == 1
    assert "line 4" in one_line_error(result)
    assert producer.connection.llen(producer.keys.rq_queue) == 0


@pytest.mark.parametrize(
    "line, complaint",
    [
        ('{"question": 1}', 'expected an object with an "input" key'),
        ('{"input": 1, "priority": 2}', "unknown key(s) priority"),
    ],
)
def test_jsonl_line_of_the_wrong_shape_is_named(rollq: Callable[..., Result], line: str, complaint: str) -> None:
    result = rollq("enqueue", input=line + "\n")

    assert result.exit_code == 1
    assert one_line_error(result) == f"rollq: line 1: {complaint}; nothing was queued"


def test_enqueue_from_stdin_queues_each_line_and_prints_its_id(
    rollq: Callable[..., Result], producer: Producer
) -> None:
    lines = [
        {"input": {"q": "1+1"}},
        {"input": "plain text", "rollout_id": "chosen-id", "mode": "val", "metadata": {"source": "cli"}},
    ]

    result = rollq("enqueue", "--mode", "train", input="".join(json.dumps(line) + "\n" for line in lines))

    assert result.exit_code == 0, result.output
    first_id, second_id = result.stdout.split()
    first, second = producer.get_task(first_id), producer.get_task(second_id)
    assert (first.input, first.mode) == ({"q": "1+1"}, "train")
    assert (second.rollout_id, second.input, second.mode, second.metadata) == (
        "chosen-id",
        "plain text",
        "val",
        {"source": "cli"},
    )
    assert producer.connection.llen(producer.keys.rq_queue) == 2


def test_enqueue_with_an_unknown_resources_id_is_one_line_exit_1(rollq: Callable[..., Result]) -> None:
    result = rollq("enqueue", "--resources-id", "v9", input='{"input": 1}\n')

    assert result.exit_code == 1
    assert "v9" in one_line_error(result)


def test_resources_set_get_list_round_trip(rollq: Callable[..., Result], producer: Producer) -> None:
    first = {"main_llm": {"resource_type": "llm", "endpoint": "http://llm:8000/v1", "model": "small"}}
    second = {"main_llm": {"resource_type": "llm", "endpoint": "http://llm:8000/v1", "model": "large"}}

    v1 = rollq("resources", "set", input=json.dumps(first)).stdout.strip()
    v2 = rollq("resources", "set", input=json.dumps(second)).stdout.strip()
    listed = rollq("resources", "list").stdout.splitlines()
    latest = json.loads(rollq("resources", "get").stdout)
    older = json.loads(rollq("resources", "get", v1).stdout)

    assert listed == [v1, f"{v2} *"]
    assert (latest["resources_id"], latest["resources"]["main_llm"]["model"]) == (v2, "large")
    assert (older["resources_id"], older["resources"]["main_llm"]["model"]) == (v1, "small")
    assert producer.get_resources().resources_id == v2


@pytest.mark.parametrize(
    "args, stdin, needle",
    [
        (("resources", "set"), "{not json", "not valid JSON"),
        (("resources", "get", "v42"), None, "v42"),
    ],
)
def test_resources_errors_are_one_line_exit_1(
    rollq: Callable[..., Result], args: tuple[str, ...], stdin: str | None, needle: str
) -> None:
    result = rollq(*args, input=stdin)

    assert result.exit_code == 1
    assert needle in one_line_error(result)


def test_status_json_and_prometheus_parse(
    rollq: Callable[..., Result],
    producer: Producer,
    run_worker: Callable[[], None],
    namespace: str,
) -> None:
    producer.enqueue_many([{"n": i} for i in range(3)], mode="train")
    run_worker()
    producer.enqueue({"n": 3}, mode="val")

    status = json.loads(rollq("status", "--json").stdout)
    exposition = rollq("status", "--prometheus").stdout

    assert (status["namespace"], status["queued"], status["succeeded"]) == (namespace, 1, 3)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    assert samples[("rollq_queue_depth", (("namespace", namespace),))] == 1
    assert samples[("rollq_rollout_duration_seconds_bucket", (("le", "+Inf"), ("namespace", namespace)))] == 3
    assert (
        samples[("rollq_rollouts_total", (("mode", "train"), ("namespace", namespace), ("status", "succeeded")))] == 3
    )
    assert samples[("rollq_reward_count", (("mode", "train"), ("namespace", namespace), ("resources_id", "")))] == 3
    assert samples[("rollq_reward_sum", (("mode", "train"), ("namespace", namespace), ("resources_id", "")))] == 3.0


def test_status_text_names_the_namespace(rollq: Callable[..., Result], namespace: str) -> None:
    result = rollq("status")

    assert result.exit_code == 0, result.output
    assert namespace in result.stdout


def test_status_counts_a_junk_in_flight_member_or_a_broken_task_key_instead_of_failing(
    rollq: Callable[..., Result], producer: Producer
) -> None:
    producer.connection.zadd(producer.keys.inflight, {"no-attempt-number": 1, "string-key|1": 2})
    producer.connection.set(producer.keys.task("string-key"), "not a hash")
    result = rollq("status", "--json")

    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["in_flight"] == 2 and status["in_flight_by_worker"] == {"?": 2}


def test_resources_set_takes_what_resources_get_printed(rollq: Callable[..., Result], producer: Producer) -> None:
    first = rollq(
        "resources", "set", input='{"main_llm": {"resource_type": "llm", "endpoint": "http://x", "model": "m"}}'
    )
    assert first.exit_code == 0, first.output
    printed = rollq("resources", "get").stdout

    again = rollq("resources", "set", input=printed)  # a round trip: get's output edited and set again

    assert again.exit_code == 0, again.output
    assert producer.get_resources().resources == producer.get_resources(first.stdout.strip()).resources


def test_dead_letter_list_and_requeue(
    rollq: Callable[..., Result],
    producer: Producer,
    run_worker: Callable[[], None],
) -> None:
    failed = producer.enqueue({"fail": True}, mode="train").rollout_id
    producer.enqueue({"fail": False}, mode="train")
    run_worker()

    listed = rollq("dead-letter", "list").stdout.splitlines()
    requeued = rollq("dead-letter", "requeue", failed)
    after = rollq("dead-letter", "list").stdout.split()

    assert listed == [f"{failed}\t1 attempt(s)\tRuntimeError: asked to fail {failed}"]
    assert requeued.exit_code == 0 and requeued.stdout.strip() == "requeued 1 task(s)"
    assert after == []
    assert producer.connection.llen(producer.keys.rq_queue) == 1


def test_one_corrupt_record_is_named_and_the_other_dead_lettered_tasks_are_listed_and_requeued(
    rollq: Callable[..., Result],
    producer: Producer,
    run_worker: Callable[[], None],
) -> None:
    # An outside audit: one corrupt record made `dead-letter list`, `dead-letter requeue --all` and
    # Producer.requeue_dead() fail whole with "task ... is not a valid rollq task", for every other task too.
    corrupt, wrong_type, good = (producer.enqueue({"fail": True}).rollout_id for _ in range(3))
    run_worker()
    producer.connection.hset(producer.keys.task(corrupt), "task", "not json")
    producer.connection.delete(producer.keys.task(wrong_type))
    producer.connection.set(producer.keys.task(wrong_type), "a string")

    listed = rollq("dead-letter", "list")
    requeued = rollq("dead-letter", "requeue", "--all")

    assert listed.exit_code == 0, listed.output
    lines = dict(line.split("\t", 1) for line in listed.stdout.splitlines())
    assert lines[good] == f"1 attempt(s)\tRuntimeError: asked to fail {good}"
    assert lines[corrupt].startswith(f"0 attempt(s)\tInvalidTaskError: task {corrupt} is not a valid rollq task")
    assert lines[wrong_type].startswith("0 attempt(s)\tInvalidTaskError:") and "holds no hash" in lines[wrong_type]
    assert requeued.exit_code == 1 and requeued.stdout.strip() == "requeued 1 task(s)"
    assert corrupt in requeued.stderr and wrong_type in requeued.stderr
    assert sorted(producer.dead_letter()) == sorted([corrupt, wrong_type])
    assert producer.requeue_dead() == []


def test_tasks_list_shows_the_other_tasks_and_names_an_invalid_record(
    rollq: Callable[..., Result], producer: Producer, url: str, namespace: str
) -> None:
    corrupt, wrong_type, good = (t.rollout_id for t in producer.enqueue_many([{}, {}, {}]))
    producer.connection.hset(producer.keys.task(corrupt), "state", "weird")
    producer.connection.delete(producer.keys.task(wrong_type))
    producer.connection.set(producer.keys.task(wrong_type), "a string")

    result = rollq("tasks", "list")

    assert result.exit_code == 0, result.output
    listed = {line["rollout_id"]: line for line in map(json.loads, result.stdout.splitlines())}
    assert listed[good]["state"] == "queued"
    assert listed[corrupt]["state"] == "invalid" and "weird" in listed[corrupt]["error"]
    assert listed[wrong_type]["state"] == "invalid" and "holds no hash" in listed[wrong_type]["error"]
    for page in (producer.query_tasks(), asyncio.run(AsyncProducer.from_url(url, namespace).query_tasks())):
        assert [t.rollout_id for t in page.tasks] == [good] and sorted(page.invalid) == sorted([corrupt, wrong_type])


def test_dead_letter_requeue_of_an_unknown_id_exits_1_and_names_it(rollq: Callable[..., Result]) -> None:
    result = rollq("dead-letter", "requeue", "never-failed")

    assert result.exit_code == 1
    assert result.stdout.strip() == "requeued 0 task(s)"
    assert "never-failed" in result.stderr


def test_dead_letter_requeue_without_ids_is_a_usage_error(rollq: Callable[..., Result]) -> None:
    result = rollq("dead-letter", "requeue")

    assert result.exit_code == 2
    assert "--all" in result.stderr


@pytest.mark.parametrize("group", [None, "cli-readers"], ids=["stream", "consumer-group"])
def test_rollouts_tail_prints_count_rollouts_from_the_start(
    rollq: Callable[..., Result],
    producer: Producer,
    run_worker: Callable[[], None],
    group: str | None,
) -> None:
    ids = [task.rollout_id for task in producer.enqueue_many([{"n": i} for i in range(5)], mode="train")]
    run_worker()

    result = rollq("rollouts", "tail", "--count", "3", "--from-start", *(["--group", group] if group else []))

    assert result.exit_code == 0, result.output
    rollouts = [Rollout.model_validate_json(line) for line in result.stdout.splitlines()]
    assert len(rollouts) == 3
    assert {r.rollout_id for r in rollouts} <= set(ids)
    assert all(r.final_reward == 1.0 for r in rollouts)


def test_rollouts_tail_skips_entries_rollq_did_not_write(rollq: Callable[..., Result], producer: Producer) -> None:
    # Found by an outside audit: `tail --from-start` raised KeyError on one entry without a rollout.
    (task,) = producer.enqueue_many([{"n": 1}])
    for entry in ({"foo": "bar"}, {"rollout_id": "x"}, {"rollout_id": "x", "rollout": b"\xff\xfe"}):
        producer.connection.xadd(producer.keys.results, entry)  # type: ignore[arg-type]
    producer.cancel([task.rollout_id])  # its cancelled rollout follows them

    result = rollq("rollouts", "tail", "--count", "1", "--from-start")

    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert Rollout.model_validate_json(line).rollout_id == task.rollout_id


def test_rollouts_tail_of_a_group_takes_only_the_rollouts_it_prints_and_the_next_reader_gets_the_rest(
    rollq: Callable[..., Result], producer: Producer, run_worker: Callable[[], None]
) -> None:
    ids = [task.rollout_id for task in producer.enqueue_many([{"n": i} for i in range(5)], mode="train")]
    run_worker()

    first = rollq("rollouts", "tail", "--count", "2", "--from-start", "--group", "g2")
    assert first.exit_code == 0, first.output
    assert producer.connection.xpending(producer.keys.results, "g2")["pending"] == 0  # none held by a gone reader
    second = rollq("rollouts", "tail", "--count", "3", "--group", "g2")
    assert second.exit_code == 0, second.output
    printed = [Rollout.model_validate_json(line).rollout_id for line in (first.stdout + second.stdout).splitlines()]
    assert sorted(printed) == sorted(ids)


@pytest.mark.redis
def test_enqueue_and_status_through_the_entry_point_on_a_real_redis(redis_server: RedisServer, namespace: str) -> None:
    base = [ROLLQ, "--url", redis_server.url, "-n", namespace]

    enqueued = subprocess.run(
        [*base, "enqueue"], input='{"input": 1}\n{"input": 2}\n', capture_output=True, text=True, timeout=60
    )
    status = subprocess.run([*base, "status", "--json"], capture_output=True, text=True, timeout=60)

    assert enqueued.returncode == 0, enqueued.stderr
    ids = enqueued.stdout.split()
    producer = Producer.from_url(redis_server.url, namespace)
    assert [producer.get_task(rid).input for rid in ids] == [1, 2]
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["queued"] == 2


def test_dashboard_on_an_in_process_redis_is_one_line_exit_1(rollq: Callable[..., Result]) -> None:
    result = rollq("dashboard")

    assert result.exit_code == 1
    assert "memory://" in one_line_error(result)
