"""``serve-agl`` trusts no client, as ``serve-al`` does: a write for an attempt needs the token it was listed with,
a runner that claims and never finishes holds at most its share and its leases are handed back uncharged, bodies
are bounded, and off loopback it needs a key. Real redis-server, real HTTP (AL 1.0.2's routes spoken with httpx,
as its controller speaks them); AL's own controller against these checks is in test_agl1_real.py."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest

from rollq.compat import refusals
from rollq.compat.agl1.runners import LeaseSettings
from rollq.compat.agl1.schemas import RolloutState
from rollq.compat.agl1.store import Agl1Store
from rollq.compat.agl1.upstream import ProxySettings
from rollq.models.policy import RolloutPolicy, TaskState
from rollq.ops.metrics import render_prometheus
from rollq.ops.status import render_text, snapshot
from rollq.producer.producer import Producer
from rollq.store.connection import connect
from rollq.store.reaper import reap
from rollq.store.stats import StatsField
from tests.support.serve_agl import KEY, MODEL, Running
from tests.support.serve_agl import claim as _claim
from tests.support.serve_agl import create as _create
from tests.support.serve_agl import listed as _listed
from tests.support.servers import REPO, ROLLQ, RedisServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


def _store(url: str, namespace: str, policy: RolloutPolicy | None = None, **leases: Any) -> Agl1Store:
    producer = Producer(connect(url), namespace, policy=policy or RolloutPolicy())
    return Agl1Store(producer, ProxySettings(model_name=MODEL), LeaseSettings(**leases))


@pytest.fixture
def serve(redis_server: RedisServer, namespace: str) -> Iterator[Any]:
    started: list[Running] = []

    def start(policy: RolloutPolicy | None = None, *, max_body_bytes: int | None = None, **leases: Any) -> Running:
        store = _store(redis_server.url, namespace, policy, **leases)
        running = Running(store, max_body_bytes=max_body_bytes, release_interval=0.2)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def _refused(store: Agl1Store) -> int:
    return int(cast(bytes | None, store.connection.hget(store.keys.stats, StatsField.GATEWAY_REFUSED)) or 0)


def _event(api: Running, listed: str, value: float) -> int:
    body = {"event_type": "reward", "data": {"value": value}}
    return api.client.post(f"/api/rollouts/{listed}/attempt/0/events", json=body).status_code


def test_writes_without_the_token_of_the_runners_attempt_are_refused_counted_and_not_stored(serve) -> None:  # type: ignore[no-untyped-def]
    api = serve()
    store = api.server.store
    _create(api, {"input": 1, "rollout_id": "a1"}, {"input": 2, "rollout_id": "w1"})
    a1 = _claim(api, "a1")
    token = a1.rpartition(".")[2]

    # A bare id (what every write was on the old serve-agl), a forged token, a token of another rollout.
    for forged in ("a1", f"a1.{'0' * 16}", f"a1.{_listed(api, 'w1').rpartition('.')[2]}"):
        assert _event(api, forged, -1000.0) == 403
        assert api.client.patch(f"/api/rollouts/{forged}", json={"status": {"state": "succeeded"}}).status_code == 403
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert (
        api.client.post("/proxy/rollout/a1/attempt/0/mode/train/openai/v1/chat/completions", json=chat)
        .json()["detail"]
        .startswith("an LLM call for a1 needs the id serve-agl listed it with")
    )
    assert _refused(store) == 7
    assert store.connection.llen(store.agl.events("a1")) == 0
    assert store.producer.task_info("a1").state == TaskState.RUNNING

    # An attempt a rollq worker runs was handed out by no gateway: the token its listing showed while it was queued
    # takes nothing, and it cannot be failed or rewarded from outside (the old serve-agl failed it on a bare PATCH).
    w1 = _listed(api, "w1")
    job = cast(bytes, store.connection.hget(store.keys.task("w1"), "job")).decode()
    store.connection.lrem(store.keys.rq_queue, 1, job)
    store.producer.lifecycle.claim("w1", job, "a-rollq-worker")
    assert _event(api, w1, -1000.0) == 403
    assert api.client.patch(f"/api/rollouts/{w1}", json={"status": {"state": "failed"}}).status_code == 403
    assert api.client.patch("/api/rollouts/w1", json={"status": {"state": "failed"}}).status_code == 403
    assert store.producer.task_info("w1").state == TaskState.RUNNING
    assert _refused(store) == 10

    # The runner's own writes, with its token, go through and publish.
    assert _event(api, a1, 0.5) == 200
    done = api.client.patch(f"/api/rollouts/a1.{token}", json={"status": {"state": "succeeded"}})
    assert done.status_code == 200 and done.json()["status"]["state"] == "succeeded"
    (rollout,) = store.producer.wait(["a1"], timeout=10)
    assert rollout.final_reward == 0.5
    # Once it has ended its token takes nothing more.
    assert _event(api, a1, 9.0) == 403
    assert _refused(store) == 11
    # rollq status shows the count, where serve-al's refusals show.
    seen = snapshot(store.connection, store.keys)
    assert "gateway           11 post(s) refused" in render_text(seen)
    assert f'rollq_gateway_refusals_total{{namespace="{store.keys.namespace}",what="refused"}} 11.0' in (
        render_prometheus(seen)
    )


def test_a_runner_that_claims_and_never_finishes_holds_at_most_its_share_and_fails_no_rollout(serve) -> None:  # type: ignore[no-untyped-def]
    # One attempt each: on the old serve-agl every rollout this runner touched was failed once its claim lapsed.
    policy = RolloutPolicy(max_attempts=1, unresponsive_seconds=1, timeout_seconds=60)
    api = serve(policy, lease_seconds=1.0, max_held_per_client=2, max_releases=10)
    store = api.server.store
    ids = [r["rollout_id"] for r in _create(api, *({"input": i} for i in range(5)))]

    listed = [_listed(api, rid) for rid in ids]
    codes = [api.client.patch(f"/api/rollouts/{x}", json={"status": {"state": "running"}}).status_code for x in listed]
    assert sorted(codes) == [200, 200, 429, 429, 429]
    held = [x for x, code in zip(listed, codes, strict=True) if code == 200]

    # Its leases end (it never wrote) and are handed back, the attempt not charged: all queued again.
    wait_until(lambda: {store.producer.task_info(r).state for r in ids} == {TaskState.QUEUED}, "hand-backs", 10)
    assert int(cast(bytes, store.connection.hget(store.keys.stats, StatsField.GATEWAY_RELEASED))) == 2
    # The token of the attempt handed back takes nothing (a post for another attempt).
    assert api.client.patch(f"/api/rollouts/{held[0]}", json={"status": {"state": "succeeded"}}).status_code == 403

    # A runner that finishes what it claims then runs every rollout, one attempt each.
    for rid in ids:
        claimed = _claim(api, rid)
        assert _event(api, claimed, 1.0) == 200
        assert api.client.patch(f"/api/rollouts/{claimed}", json={"status": {"state": "succeeded"}}).status_code == 200
    rollouts = store.producer.wait(ids, timeout=10)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 5 and {r.final_reward for r in rollouts} == {1.0}


def test_a_runner_that_keeps_listing_keeps_its_lease(serve) -> None:  # type: ignore[no-untyped-def]
    api = serve(RolloutPolicy(timeout_seconds=60), lease_seconds=1.0)
    store = api.server.store
    _create(api, {"input": 1, "rollout_id": "l1"})
    l1 = _claim(api, "l1")
    until = time.monotonic() + 3
    while time.monotonic() < until:  # AL's controller lists every poll_interval while its agent runs
        assert _listed(api, "l1") == l1
        time.sleep(0.3)
    assert store.producer.task_info("l1").state == TaskState.RUNNING
    # Another client address is shown the bare id: the listing gives nobody else the running attempt's token.
    assert [r.rollout_id for r in store.in_states([RolloutState.RUNNING], 10, "agl-client@10.0.0.9")] == ["l1"]


def test_bodies_over_the_limit_or_nested_too_deep_are_refused_and_store_nothing(serve) -> None:  # type: ignore[no-untyped-def]
    api = serve(max_body_bytes=65536)
    store = api.server.store
    _create(api, {"input": 1, "rollout_id": "b1"})
    b1 = _claim(api, "b1")
    url = f"/api/rollouts/{b1}/attempt/0/events"
    big = {"event_type": "reward", "data": {"value": 1.0, "junk": "x" * 200_000}}
    assert api.client.post(url, json=big).status_code == 413
    nested = b'{"event_type": "reward", "data": {"x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}}"
    deep = api.client.post(url, content=nested, headers={"content-type": "application/json"})
    assert deep.status_code == 400 and "deeper than 64" in deep.json()["detail"]
    proxy = f"/proxy/rollout/{b1}/attempt/0/mode/train/openai/v1/chat/completions"
    assert api.client.post(proxy, content=b'{"messages": ' + b"[" * 100 + b"]" * 100 + b"}").status_code == 400
    assert api.client.post("/api/rollouts", content=b"[" * 3000 + b"]" * 3000).status_code == 400
    assert store.connection.llen(store.agl.events("b1")) == 0
    # Bytes that are not UTF-8 are not JSON: 400 (or FastAPI's 422), never a 500.
    not_utf8 = {"content": b'{"input": "\xff\xfe"}', "headers": {"content-type": "application/json"}}
    assert api.client.post("/api/rollouts", **not_utf8).status_code in (400, 422)
    not_utf8_event = b'{"event_type": "reward", "data": {"x": "\xff"}}'
    assert api.client.post(url, content=not_utf8_event, headers={"content-type": "application/json"}).status_code in (
        400,
        422,
    )
    assert api.client.post(proxy, content=b'{"messages": "\xff"}').status_code == 400
    # NaN is not JSON (Python's parser takes it): refused naming where, not queued as null.
    nan = api.client.post(
        "/api/rollouts", content=b'[{"input": {"x": NaN}}]', headers={"content-type": "application/json"}
    )
    assert nan.status_code == 422 and "['input']['x'] is not a finite number" in nan.json()["detail"], nan.text
    assert store.connection.llen(store.agl.events("b1")) == 0


def test_serve_agl_refuses_to_bind_beyond_loopback_without_a_key(redis_server: RedisServer, namespace: str) -> None:
    result = subprocess.run(
        [ROLLQ, "--url", redis_server.url, "-n", namespace, "serve-agl", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2 and "refusing to serve on 0.0.0.0 without a key" in result.stderr


def test_with_a_key_every_write_needs_it_too(serve) -> None:  # type: ignore[no-untyped-def]
    api = serve()
    _create(api, {"input": 1, "rollout_id": "k1"})
    k1 = _claim(api, "k1")
    bare = httpx.Client(base_url=api.client.base_url)
    assert bare.post(f"/api/rollouts/{k1}/attempt/0/events", json={"event_type": "reward"}).status_code == 401
    assert bare.patch(f"/api/rollouts/{k1}", json={"status": {"state": "succeeded"}}).status_code == 401
    assert KEY and api.server.store.producer.task_info("k1").state == TaskState.RUNNING


def test_a_claim_redis_refuses_is_a_503_naming_the_refusal_logged_once_and_the_sweep_issues_the_task_again(
    serve, caplog, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # An operator's audit: a claim Redis refused (here claim.lua's refusal of an in-flight set of another type) was
    # not answered as the server's trouble. It is a 503 with a JSON body naming the refusal and a Retry-After; AL
    # 1.0's controller logs a failed PATCH and sends it again at its next reconcile. Logged once, not per PATCH.
    monkeypatch.setattr(refusals, "_logged", {})
    caplog.set_level(logging.ERROR, logger="rollq.compat.refusals")
    api = serve(RolloutPolicy(timeout_seconds=60))
    store = api.server.store
    _create(api, {"input": 1, "rollout_id": "c1"})
    listed_id = _listed(api, "c1")
    store.connection.set(store.keys.inflight, "junk")
    for _ in range(2):  # the controller PATCHes again at its next reconcile
        answer = api.client.patch(f"/api/rollouts/{listed_id}", json={"status": {"state": "running"}})
        assert answer.status_code == 503, answer.text
        assert f"the in-flight set {store.keys.inflight} is a string, not a zset" in answer.json()["detail"]
        assert int(answer.headers["Retry-After"]) > 0
    assert [r.getMessage().startswith("Redis refused the request") for r in caplog.records] == [True], caplog.text
    assert store.producer.task_info("c1").state == TaskState.QUEUED
    # Nothing lost: once the key is repaired, the lost-job sweep (any rollq worker's reaper) issues the task again.
    store.connection.delete(store.keys.inflight)
    lifecycle = store.producer.lifecycle
    wait_until(lambda: reap(lifecycle, results_maxlen=100).reissued == 1, "the sweep to issue the task again", 10)
    claimed = _claim(api, "c1")
    assert api.client.patch(f"/api/rollouts/{claimed}", json={"status": {"state": "succeeded"}}).status_code == 200
    (rollout,) = store.producer.wait(["c1"], timeout=10)
    assert rollout.metadata["status"] == "succeeded"
