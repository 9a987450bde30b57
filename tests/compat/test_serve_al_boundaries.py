"""``rollq serve-al`` trusts no client: a post needs the token handed out with its attempt, a client that polls
and never posts fails no task, bodies are bounded, and off loopback it needs a key. Real redis-server, real
``rollq serve-al`` processes and a real rollq worker; AL 0.1's HTTP exchange spoken with urllib."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from rollq.models.policy import RolloutPolicy, TaskState
from rollq.producer.producer import Producer
from rollq.store.stats import StatsField
from tests.support.http_json import get_json as _get
from tests.support.http_json import post_json as _post
from tests.support.serve_al import take_task as _take
from tests.support.servers import REPO, ROLLQ
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


def _status(url: str, payload: Any = None, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    body = data if data is not None else (json.dumps(payload).encode() if payload is not None else None)
    request = urllib.request.Request(url, body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _refused(producer: Producer) -> int:
    return int(producer.connection.hget(producer.keys.stats, StatsField.GATEWAY_REFUSED) or 0)


def test_a_post_for_an_attempt_a_worker_runs_is_refused_and_the_workers_result_delivered(
    redis_server, namespace, serve_al, workers
) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    endpoint = serve_al()
    rid = producer.enqueue({"sleep": 3}, mode="train").rollout_id
    workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.hostile_agents:HostileAgent"})
    wait_until(lambda: producer.task_info(rid).state == TaskState.RUNNING, "a worker to run the task", timeout=30)

    # The shape serve-al hands out, with no token, a made-up one, and the bare id: all refused, none stored.
    for forged in (f"{rid}#1", f"{rid}#1#{'0' * 32}", rid):
        assert _status(endpoint + "rollout", {"rollout_id": forged, "final_reward": -1000.0}) == 403
    assert _refused(producer) == 3
    assert producer.connection.xlen(producer.keys.superseded) == 0

    (rollout,) = producer.wait([rid], timeout=30)
    assert rollout.final_reward == 1.0 and rollout.metadata["status"] == "succeeded"
    assert not rollout.metadata["worker"].startswith("al-client@")


def test_a_post_with_the_token_of_another_attempt_is_refused(redis_server, namespace, serve_al) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    first, second = (t.rollout_id for t in producer.enqueue_many([{"q": 1}, {"q": 2}], mode="train"))
    endpoint, other = serve_al(), serve_al()
    handed = {(taken := _take(endpoint)).partition("#")[0]: taken for _ in range(2)}
    token_of_second = handed[second].rpartition("#")[2]
    assert _status(endpoint + "rollout", {"rollout_id": f"{first}#1#{token_of_second}", "final_reward": 5.0}) == 403
    assert _status(endpoint + "rollout", {"rollout_id": f"{first}#2#{token_of_second}", "final_reward": 5.0}) == 403
    assert _refused(producer) == 2
    # The real ones are taken, by the gateway that handed them out or by another one of the namespace.
    assert _post(endpoint + "rollout", {"rollout_id": handed[first], "final_reward": 1.0})["status"] == "delivered"
    assert _post(other + "rollout", {"rollout_id": handed[second], "final_reward": 2.0})["status"] == "delivered"
    assert sorted(r.final_reward for r in producer.wait([first, second], timeout=10)) == [1.0, 2.0]  # type: ignore[type-var]
    # Posting an attempt again (junk a token holder could repeat) is refused, not stored as superseded.
    assert _status(endpoint + "rollout", {"rollout_id": handed[first], "final_reward": 9.0}) == 403
    assert _refused(producer) == 3
    assert producer.connection.xlen(producer.keys.superseded) == 0


@pytest.mark.slow
def test_a_client_that_polls_and_never_posts_fails_no_task_and_holds_at_most_its_share(
    redis_server, namespace, serve_al
) -> None:  # type: ignore[no-untyped-def]
    # One attempt each: on 48fc877 every task the poller touched was failed once its lease ran out.
    policy = RolloutPolicy(max_attempts=1, unresponsive_seconds=1, timeout_seconds=60)
    producer = Producer.from_url(redis_server.url, namespace, policy=policy)
    ids = [t.rollout_id for t in producer.enqueue_many([{"q": i} for i in range(10)], mode="train")]
    endpoint = serve_al("--lease", "1", "--max-held", "4", "--max-releases", "10")

    held_most = 0
    until = time.monotonic() + 4  # four leases and more: every task it holds is handed back at least once
    while time.monotonic() < until:
        answer = _get(endpoint + "task")
        held_most += answer["is_available"]
        time.sleep(0.05)
    # It got tasks again as its leases ended, but never more than 4 at a time (polled ~80 times).
    assert 4 <= held_most <= 4 * 6, held_most

    # Its last leases end and are handed back; a good client then runs every task.
    time.sleep(2)
    assert {producer.task_info(rid).state for rid in ids} == {TaskState.QUEUED}
    posted = 0
    while posted < len(ids):
        answer = _get(endpoint + "task")
        assert answer["is_available"], f"only {posted} tasks came back"
        assert _post(endpoint + "rollout", {"rollout_id": answer["task"]["rollout_id"], "final_reward": 1.0})[
            "status"
        ] == ("delivered")
        posted += 1
    rollouts = producer.wait(ids, timeout=10)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * len(ids)
    assert int(producer.connection.hget(producer.keys.stats, StatsField.GATEWAY_RELEASED) or 0) >= 4


def test_a_body_over_the_limit_is_refused_and_stores_nothing(redis_server, namespace, serve_al) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    producer.enqueue({"q": 1}, mode="train")
    endpoint = serve_al("--max-body-bytes", "65536")
    handed = _take(endpoint)
    big = {"rollout_id": handed, "final_reward": 1.0, "metadata": {"junk": "x" * 200_000}}
    assert _status(endpoint + "rollout", big) == 413
    deep = b'{"rollout_id": "a", "metadata": ' + b"[" * 60_000 + b"]" * 60_000 + b"}"
    assert _status(endpoint + "rollout", data=deep) in (400, 413)
    nested = ("[" * 5_000 + "]" * 5_000).encode()
    assert _status(endpoint + "rollout", data=b'{"rollout_id": "a", "metadata": {"x": ' + nested + b"}}") == 400
    assert producer.connection.xlen(producer.keys.superseded) == 0
    assert producer.connection.xlen(producer.keys.results) == 0


@pytest.mark.parametrize("reward", [b"NaN", b"Infinity", b"1e400"])
def test_a_posted_reward_that_is_not_finite_fails_the_rollout_naming_it(
    redis_server, namespace, serve_al, reward
) -> None:  # type: ignore[no-untyped-def]
    # As a worker fails an agent's non-finite reward: never a "succeeded" rollout whose reward became null.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60, max_attempts=1))
    rid = producer.enqueue({"q": 1}, mode="train").rollout_id
    endpoint = serve_al()
    handed = _take(endpoint)
    body = b'{"rollout_id": "' + handed.encode() + b'", "final_reward": ' + reward + b"}"
    assert _status(endpoint + "rollout", data=body) == 200
    (rollout,) = producer.wait([rid], timeout=10)
    assert rollout.metadata["status"] == "failed" and rollout.final_reward is None
    assert rollout.metadata["error"]["type"] == "InvalidRewardError"


def test_a_body_that_is_not_utf8_is_a_400_and_stores_nothing(redis_server, namespace, serve_al) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    producer.enqueue({"q": 1}, mode="train")
    endpoint = serve_al()
    handed = _take(endpoint)
    body = b'{"rollout_id": "' + handed.encode() + b'", "final_reward": 1.0, "metadata": {"x": "\xff\xfe"}}'
    assert _status(endpoint + "rollout", data=body) == 400
    assert producer.connection.xlen(producer.keys.results) == 0


def test_serve_al_refuses_to_bind_beyond_loopback_without_a_key(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [ROLLQ, "--url", redis_server.url, "-n", namespace, "serve-al", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2 and "refusing to serve on 0.0.0.0 without a key" in result.stderr


def test_with_a_key_every_route_needs_it(redis_server, namespace, serve_al) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    rid = producer.enqueue({"q": 1}, mode="train").rollout_id
    endpoint = serve_al("--key", "s3cret")
    assert _status(endpoint + "task") == 401
    assert _status(endpoint + "task", headers={"Authorization": "Bearer wrong"}) == 401
    assert _status(endpoint + "resources/latest", headers={"x-api-key": "wrong"}) == 401
    assert producer.task_info(rid).state == TaskState.QUEUED
    request = urllib.request.Request(endpoint + "task", headers={"Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["is_available"] and answer["task"]["rollout_id"].startswith(f"{rid}#1#")


def _answer(url: str) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of a GET, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return int(response.status), dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(exc.headers), json.loads(exc.read())


def test_a_claim_redis_refuses_is_a_503_naming_the_refusal_logged_once_and_the_task_is_handed_out_after_repair(
    redis_server, namespace, serve_al, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # An operator's audit: a claim Redis refused (here claim.lua's refusal of an in-flight set of another type) was
    # answered as if the client were wrong. It is the server's trouble: a 503 with a JSON body naming the refusal and
    # a Retry-After, which AL 0.1-0.3's client treats as "no task yet" and polls again; logged once, not per poll.
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60, unresponsive_seconds=1)
    )
    rid = producer.enqueue({"q": 1}, mode="train").rollout_id
    endpoint = serve_al()
    producer.connection.set(producer.keys.inflight, "junk")
    refusals = 0
    until = time.monotonic() + 30
    while refusals < 2 and time.monotonic() < until:  # the sweep puts the job back, the next claim is refused again
        status, headers, body = _answer(endpoint + "task")
        if status == 200:
            assert not body["is_available"], body
            time.sleep(0.2)
            continue
        assert status == 503, (status, body)
        assert f"the in-flight set {producer.keys.inflight} is a string, not a zset" in body["detail"], body
        assert int(headers["Retry-After"]) > 0
        refusals += 1
    assert refusals == 2
    log = (tmp_path / "serve-al-0.log").read_text()
    assert log.count("Redis refused the claim") == 1, log  # once a minute, not once a poll
    # Nothing lost: once the key is repaired, the sweep puts the job back and the task is handed out.
    producer.connection.delete(producer.keys.inflight)
    wait_until(lambda: _answer(endpoint + "task")[2].get("is_available"), "the task to be handed out again", timeout=30)
    assert producer.task_info(rid).state == TaskState.RUNNING
