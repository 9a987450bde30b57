"""``rollq tasks list|cancel`` on a memory:// Redis shared with a Producer and an in-process worker."""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Callable
from typing import Any

from click.testing import Result

from rollq.models.policy import RolloutPolicy
from rollq.producer import Producer
from rollq.store.connection import connect
from rollq.store.replies import Claim, Requeued
from rollq.store.transitions import Lifecycle
from rollq.worker import LitAgent, RolloutWorker, WorkerSettings


class OneAgent(LitAgent):
    def training_rollout(self, task_input, rollout_id, resources):  # type: ignore[no-untyped-def]
        if task_input.get("fail"):
            raise ValueError("asked to fail")
        return 1.0


def run_worker(url: str, namespace: str) -> None:
    worker = RolloutWorker([namespace], connection=connect(url), agent=OneAgent(), settings=WorkerSettings())
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.work(burst=True, logging_level="WARNING")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_tasks_list_and_cancel(url: str, namespace: str, rollq: Callable[..., Result]) -> None:
    producer = Producer.from_url(url, namespace)
    ran, cancelled = [t.rollout_id for t in producer.enqueue_many([{}, {}], mode="train")]
    result = rollq("tasks", "cancel", cancelled, "nope")
    # An unknown id fails the command (exit 1, as dead-letter requeue does), after the others were cancelled.
    assert result.exit_code == 1 and result.stdout.splitlines() == [
        f"{cancelled}: cancelled (was queued)",
        "nope: unknown",
    ]
    assert result.stderr.strip() == "rollq: no task 'nope' (1 of 2 id(s) unknown)"
    run_worker(url, namespace)
    listed = rollq("tasks", "list", "--state", "succeeded")
    assert [json.loads(line)["rollout_id"] for line in listed.stdout.splitlines()] == [ran]
    assert json.loads(rollq("rollouts", "get", cancelled).stdout)["metadata"]["status"] == "cancelled"
    assert [
        json.loads(line)["rollout_id"] for line in rollq("tasks", "list", "--state", "cancelled").stdout.splitlines()
    ] == [cancelled]
    first = rollq("tasks", "list", "--limit", "1")
    assert len(first.stdout.splitlines()) == 1 and "--cursor" in first.stderr
    bad = rollq("tasks", "list", "--cursor", "not-a-cursor")
    assert bad.exit_code == 1 and bad.stderr.startswith("rollq: not a query_tasks cursor")


def _names_for(value: Any, printed: dict[str, Any]) -> set[str]:
    """The keys under which ``printed`` holds ``value`` (of its type: an attempt number 1 is not a time 1.0)."""
    return {key for key, other in printed.items() if type(other) is type(value) and other == value}


def test_task_json_tasks_list_and_dead_letter_list_print_a_tasks_fields_under_the_same_names(
    url: str, namespace: str, rollq: Callable[..., Result]
) -> None:
    producer = Producer.from_url(url, namespace)
    ok = producer.enqueue({}, mode="train").rollout_id
    failed = producer.enqueue({"fail": True}, mode="train").rollout_id
    run_worker(url, namespace)
    listed = {line["rollout_id"]: line for line in map(json.loads, rollq("tasks", "list").stdout.splitlines())}
    (dead,) = map(json.loads, rollq("dead-letter", "list", "--json").stdout.splitlines())
    assert dead["rollout_id"] == failed

    for rollout_id, other in [(ok, listed[ok]), (failed, listed[failed]), (failed, dead)]:
        shown = json.loads(rollq("task", rollout_id, "--json").stdout)
        for key, value in other.items():
            names = _names_for(value, shown) if value is not None else set()
            assert not names or key in names, f"{key}={value!r} is {sorted(names)} in `rollq task --json`"


def test_a_requeued_task_shows_no_current_worker_and_its_last_claim_as_the_last_one(
    url: str, namespace: str, rollq: Callable[..., Result]
) -> None:
    # An operator's audit: after a reaper (or a retry) put a task back in the queue, `rollq tasks list`, `rollq task`
    # and TaskInfo still named the worker of its previous attempt as `worker`, as if that worker held it now.
    producer = Producer.from_url(url, namespace)
    task = producer.enqueue({}, mode="train")
    rid = task.rollout_id
    lifecycle = Lifecycle(connect(url), producer.keys)
    claim = lifecycle.claim(rid, producer.keys.job_id(rid), "worker-a")
    assert isinstance(claim, Claim)
    running = json.loads(rollq("task", rid, "--json").stdout)
    assert (running["state"], running["worker"], running["last_worker"]) == ("running", "worker-a", "worker-a")
    # What a reaper does with an attempt whose worker went quiet.
    assert isinstance(lifecycle.requeue(task, claim.attempt, RolloutPolicy(), "unresponsive"), Requeued)

    (listed,) = map(json.loads, rollq("tasks", "list").stdout.splitlines())
    shown = json.loads(rollq("task", rid, "--json").stdout)
    for view in (listed, shown, dataclasses.asdict(producer.task_info(rid))):
        assert (view["state"], view["worker"]) == ("queued", None), view
        assert (view["last_worker"], view["last_claim_at"]) == ("worker-a", claim.claimed_at), view
    text = dict(line.split(None, 1) for line in rollq("task", rid).stdout.splitlines() if line.strip())
    assert text["worker"] == "-"
    assert text["last"].startswith("claim ") and text["last"].endswith(" by worker-a"), text
