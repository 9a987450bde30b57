"""``serve-agl``'s HTTP API against a real redis-server, spoken as AL 1.0.2's clients speak it: routes, status codes,
the bearer key, idempotent creation, PATCH moves, the terminal cursor, events, models, the proxy and its pause."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from rollq.compat.agl1.adapter import Agl1Agent, Agl1AgentError, env_from_map
from rollq.compat.agl1.store import Agl1Store
from rollq.compat.agl1.upstream import ProxySettings
from rollq.ops.cli import main
from rollq.producer.producer import Producer
from rollq.store.connection import connect
from tests.support.fake_vllm import FakeVLLM
from tests.support.serve_agl import KEY, MODEL, Running
from tests.support.serve_agl import claim as _claim
from tests.support.serve_agl import create as _create
from tests.support.serve_agl import listed as _listed
from tests.support.servers import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_server: RedisServer, namespace: str) -> Agl1Store:
    return Agl1Store(Producer(connect(redis_server.url), namespace), ProxySettings(model_name=MODEL))


@pytest.fixture
def api(store: Agl1Store) -> Iterator[Running]:
    running = Running(store)
    yield running
    running.stop()


def test_every_route_but_healthz_needs_the_bearer_key(api: Running) -> None:
    bare = httpx.Client(base_url=api.client.base_url)
    assert bare.get("/healthz").json() == {"status": "ok"}
    assert bare.get("/api/rollouts", params={"state_in": "queuing"}).status_code == 401
    assert bare.post("/proxy/pause", json={}).json() == {"detail": "Invalid or missing API key"}
    wrong = bare.get("/api/rollouts", params={"state_in": "queuing"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert bare.get("/api/rollouts", params={"state_in": "queuing"}, headers={"x-api-key": KEY}).status_code == 200


def test_creation_is_idempotent_by_rollout_id_and_reads_back_as_al_rollouts(api: Running, store: Agl1Store) -> None:
    item = {"input": {"question": "q", "data_id": "d1"}, "is_train": False, "rollout_id": "r1", "metadata": {"x": 1}}
    first = _create(api, item, {"input": 7})
    again = _create(api, {**item, "input": "other"})
    assert again[0] == first[0]
    assert first[0]["status"]["state"] == "queuing" and first[0]["status"]["last_attempt_id"] is None
    assert first[0]["input"] == {"question": "q", "data_id": "d1"} and first[0]["metadata"]["x"] == 1
    assert first[0]["config"]["timeout_seconds"] == 3600
    assert int(store.connection.llen(store.keys.rq_queue)) == 2  # the repeated id was not queued again
    detail = api.client.get("/api/rollouts/r1").json()
    assert detail["rollout"]["rollout_id"] == "r1" and detail["attempts"] == []
    assert store.producer.get_task("r1").mode == "val"
    queued = api.client.get("/api/rollouts", params=[("state_in", "queuing"), ("state_in", "running")]).json()
    # Listed with the token of the attempt a claim makes (see rollq/compat/agl1/runners.py).
    assert {r["rollout_id"].rpartition(".")[0] for r in queued} == {"r1", first[1]["rollout_id"]}
    assert api.client.get("/api/rollouts").status_code == 422  # state_in is required, as in FastAPI
    assert api.client.get("/api/rollouts/nope").json() == {"detail": "Rollout not found: nope"}


def test_patch_moves_are_al_s_and_failing_a_queued_rollout_cancels_it(api: Running, store: Agl1Store) -> None:
    _create(api, {"input": {"data_id": "a"}, "rollout_id": "p1"})
    p1 = _listed(api, "p1")
    assert api.client.patch(f"/api/rollouts/{p1}", json={"status": {"state": "succeeded"}}).status_code == 409
    failed = {"status": {"state": "failed", "error_message": "no pods"}}
    patched = api.client.patch(f"/api/rollouts/{p1}", json=failed)
    assert patched.status_code == 200
    status = patched.json()["status"]
    assert (status["state"], status["error_message"]) == ("failed", "no pods")
    assert api.client.patch(f"/api/rollouts/{p1}", json={"status": {"state": "running"}}).status_code == 403
    assert api.client.patch(f"/api/rollouts/{p1}", json={"status": {"bogus": 1}}).status_code == 422
    assert store.producer.task_info("p1").state == "cancelled"
    page = api.client.get("/api/rollouts/terminal").json()
    assert page == {
        "items": [{"rollout_id": "p1", "state": "failed", "data_id": "a", "is_train": True}],
        "next_after": 1,
        "total_terminal": 1,
    }
    assert api.client.get("/api/rollouts/terminal", params={"after": 1}).json()["items"] == []


def test_a_runner_claims_with_patch_running_and_publishes_triplets_from_its_events(
    api: Running, store: Agl1Store
) -> None:
    _create(api, {"input": 1, "rollout_id": "c1"})
    c1 = _claim(api, "c1")
    assert api.client.get(f"/api/rollouts/{c1}").json()["rollout"]["status"]["state"] == "running"
    assert int(store.connection.llen(store.keys.rq_queue)) == 0  # no rollq worker can take it now
    request = {
        "response": {"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3], "logprobs": {"content": []}}]},
        "status": "ok",
        "request": {"messages": []},
    }
    api.client.post(f"/api/rollouts/{c1}/attempt/0/events", json={"event_type": "model_request", "data": request})
    api.client.post(f"/api/rollouts/{c1}/attempt/0/events", json={"event_type": "reward", "data": {"value": 0.5}})
    trimmed = api.client.get("/api/rollouts/c1/events", params={"format": "triplet"}).json()
    assert [e["data"] for e in trimmed] == [
        {
            "prompt_token_ids": [1, 2],
            "response_token_ids": [3],
            "response_log_probs": [],
            "server": {"model": None, "version": None},
            "status": "ok",
        },
        {"value": 0.5},
    ]
    assert len(api.client.get("/api/rollouts/c1/events", params={"event_type": "reward"}).json()) == 1
    done = api.client.patch(f"/api/rollouts/{c1}", json={"status": {"state": "succeeded", "last_attempt_id": "0"}})
    assert done.json()["status"]["state"] == "succeeded"
    rollout = store.producer.get_rollout("c1")
    assert rollout is not None and rollout.final_reward == 0.5
    assert rollout.triplets is not None and rollout.triplets[0].response["token_ids"] == [3]
    assert rollout.triplets[0].reward == 0.5


def test_delete_forgets_a_rollout_and_is_idempotent(api: Running, store: Agl1Store) -> None:
    _create(api, {"input": 1, "rollout_id": "d1"})
    assert api.client.delete("/api/rollouts/d1").status_code == 204
    assert api.client.get("/api/rollouts/d1").status_code == 404
    assert api.client.delete("/api/rollouts/d1").status_code == 204
    assert api.client.post("/api/rollouts/d1/attempt/0/events", json={"event_type": "x"}).status_code == 404


def test_rollouts_outlive_the_server_that_created_them(store: Agl1Store) -> None:
    first = Running(store)
    _create(first, {"input": "kept", "rollout_id": "k1"})
    first.stop()
    second = Running(Agl1Store(Producer(store.connection, store.keys.namespace)))
    try:
        assert second.client.get("/api/rollouts/k1").json()["rollout"]["input"] == "kept"
    finally:
        second.stop()


def test_models_become_the_workers_llm_resources_sorted_by_endpoint(api: Running, store: Agl1Store) -> None:
    models = [{"model": MODEL, "endpoint": "http://b/v1", "version": 3}, {"model": MODEL, "endpoint": "http://a/v1"}]
    assert api.client.post("/api/models", json=models).status_code == 201
    resources = store.producer.get_resources().resources
    assert [(name, r.endpoint) for name, r in sorted(resources.items())] == [  # type: ignore[union-attr]
        ("agl1-0", "http://a/v1"),
        ("agl1-1", "http://b/v1"),
    ]
    assert api.client.delete("/api/models").json() == {"status": "ok"}
    assert store.models() == []


def test_the_proxy_applies_al_s_rules_records_the_call_and_answers_429_while_paused(
    api: Running, store: Agl1Store
) -> None:
    fake = FakeVLLM().start()
    try:
        _create(api, {"input": 1, "rollout_id": "x1"})
        url = f"/proxy/rollout/{_claim(api, 'x1')}/attempt/0/mode/train/openai/v1/chat/completions"
        chat = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.1}
        assert api.client.post(url, json=chat).status_code == 503  # no model registered yet
        api.client.post("/api/models", json=[{"model": MODEL, "endpoint": fake.url}])
        paused = api.client.post("/proxy/pause", json={"retry_after_seconds": 7, "reason": "weights"}).json()
        assert paused == {"paused": True, "retry_after_seconds": 7, "reason": "weights", "inflight": 0}
        refused = api.client.post(url, json=chat)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "7"
        assert refused.headers["X-Agl-Paused"] == "true"
        assert api.client.post("/proxy/resume").json()["paused"] is False
        answer = api.client.post(url, json=chat)
        assert answer.status_code == 200 and answer.json()["prompt_token_ids"]
        sent = fake.received[-1]
        assert (sent["model"], sent["temperature"], sent["return_token_ids"], sent["logprobs"]) == (
            MODEL,
            1.0,
            True,
            True,
        )
        events = api.client.get("/api/rollouts/x1/events").json()
        assert [e["event_type"] for e in events] == ["model_request"] and events[0]["attempt_id"] == "0"
        assert events[0]["data"]["server"]["endpoint"] == fake.url
        assert api.client.post(url, json={**chat, "stream": True}).status_code == 400
        assert api.client.post(url.replace("/train/", "/test/"), json=chat).status_code == 404
        assert api.client.post(url.replace("x1.", "nope."), json=chat).status_code == 404
        assert api.client.get("/proxy/state").json()["inflight"] == 0
    finally:
        fake.stop()


def test_serve_agl_refuses_to_listen_beyond_loopback_without_a_key() -> None:
    result = CliRunner().invoke(main, ["serve-agl", "--host", "0.0.0.0"], env={"ROLLQ_AGL_KEY": "", "AGL_KEY": ""})
    assert result.exit_code == 2 and "without a key" in result.output


def test_env_map_follows_al_s_rules() -> None:
    task_input = {"question": "q?", "nums": [1, {"x": 2}]}
    env = env_from_map(task_input, {"Q": "input.question", "N": "input.nums.1", "ALL": "input", "LIT": "plain"})
    assert env == {"Q": "q?", "N": '{"x": 2}', "ALL": '{"question": "q?", "nums": [1, {"x": 2}]}', "LIT": "plain"}
    with pytest.raises(Agl1AgentError, match="input.missing"):
        env_from_map(task_input, {"M": "input.missing"})


def test_a_rollout_picks_only_among_the_agent_classes_the_worker_was_given() -> None:
    agent = Agl1Agent("tests.support.agl1_agents:CalcAgent")
    assert agent._pick_class("examples.x.tests.support.agl1_agents.CalcAgent") == "tests.support.agl1_agents.CalcAgent"
    assert agent._pick_class("agl1_agents.CalcAgent") == "tests.support.agl1_agents.CalcAgent"
    assert agent._pick_class(None) == "tests.support.agl1_agents.CalcAgent"
    with pytest.raises(Agl1AgentError, match="os.system"):
        agent._pick_class("os.system")


def test_inline_isolation_runs_the_agent_in_process_with_its_environment_and_restores_it() -> None:
    """``AGL1_ISOLATION=inline``: ``run()`` in the worker's own process; the calls and the reward become the
    rollout's events, and ``os.environ`` is as it was afterwards."""
    import os

    from rollq.compat.agl1.mapping import EVENTS_METADATA_KEY, envelope
    from rollq.compat.agl1.schemas import RolloutConfig, RolloutCreate, RolloutLocalConfig
    from rollq.compat.agl1.store import PROXY_SETTINGS_KEY
    from rollq.models.contract import LLM
    from tests.support.agl1_llm import HintedVLLM

    fake = HintedVLLM().start()
    try:
        agent = Agl1Agent("tests.support.agl1_agents:CalcAgent", isolation="inline", key="k")
        local = RolloutLocalConfig(env_map={"QUESTION": "input.question", "RESULT": "input.result"})
        task_input = envelope(
            RolloutCreate(input={"question": "2+2? HINT=4", "result": "4"}, config=RolloutConfig(local=local))
        )
        settings = {**ProxySettings(model_name=MODEL).to_json(), "endpoint": fake.url, "version": 2}
        resources = {"agl1-0": LLM(endpoint=fake.url, model=MODEL, sampling_parameters={PROXY_SETTINGS_KEY: settings})}
        before = dict(os.environ)
        rollout = asyncio.run(agent.validation_rollout_async(task_input, "r-inline", resources))  # type: ignore[arg-type]
        assert dict(os.environ) == before
        events = rollout.metadata[EVENTS_METADATA_KEY]
        assert [e["event_type"] for e in events] == ["model_request", "model_request", "reward"]
        assert events[-1]["data"] == {"value": 1.0}
        assert events[0]["data"]["model_version"] == 2 and events[0]["data"]["server"]["endpoint"] == fake.url
        # Val mode: the val temperature, no logprobs, token ids asked for.
        assert [(b["temperature"], "logprobs" in b, b["return_token_ids"]) for b in fake.received] == [
            (0.7, False, True),
            (0.7, False, True),
        ]
    finally:
        fake.stop()


def _envelope(agent_class: str | None = None, env_map: dict[str, str] | None = None) -> dict[str, Any]:
    from rollq.compat.agl1.mapping import envelope
    from rollq.compat.agl1.schemas import RolloutConfig, RolloutCreate, RolloutLocalConfig

    local = RolloutLocalConfig(agent_class=agent_class, env_map=env_map or {})
    return envelope(RolloutCreate(input={}, config=RolloutConfig(local=local)))


def test_an_agent_that_crashes_fails_its_rollout_with_the_child_s_error() -> None:
    agent = Agl1Agent("tests.support.agl1_agents:CrashingAgent")
    with pytest.raises(Agl1AgentError, match=r"exited with code 1 on r-crash:.*the agent fell over"):
        asyncio.run(agent.training_rollout_async(_envelope(), "r-crash", {}))


def test_a_task_not_queued_through_the_al1_api_is_refused_by_name() -> None:
    agent = Agl1Agent("tests.support.agl1_agents:CrashingAgent")
    with pytest.raises(Agl1AgentError, match="no 'agl1' key"):
        asyncio.run(agent.training_rollout_async({"question": "q"}, "r-plain", {}))


def test_a_cut_short_rollout_takes_its_agent_process_with_it(tmp_path: Any) -> None:
    """A timeout (or hand-back) cancels the rollout: the child process is killed, not left running."""
    import os
    import time

    pidfile = tmp_path / "pid"
    agent = Agl1Agent("tests.support.agl1_agents:SleepingAgent")

    async def cut_short() -> None:
        rollout = agent.training_rollout_async(_envelope(env_map={"PIDFILE": str(pidfile)}), "r-sleep", {})
        task = asyncio.ensure_future(rollout)
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cut_short())
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the agent's process {pid} outlived its rollout")


def test_an_agent_process_does_not_outlive_a_worker_killed_with_sigkill(tmp_path: Any) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support.servers import REPO

    pidfile = tmp_path / "pid"
    script = (
        "import asyncio, sys\n"
        "from rollq.compat.agl1.adapter import Agl1Agent\n"
        "from tests.compat.test_agl1_api import _envelope\n"
        "agent = Agl1Agent('tests.support.agl1_agents:SleepingAgent')\n"
        "asyncio.run(agent.training_rollout_async(_envelope(env_map={'PIDFILE': sys.argv[1]}), 'r-orphan', {}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen([sys.executable, "-c", script, str(pidfile)], env=env, cwd=REPO)
    try:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        child = int(pidfile.read_text())
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        for _ in range(50):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the agent's process {child} outlived its SIGKILLed worker")
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_runner_claiming_one_task_of_a_pack_leaves_the_packs_other_tasks_queued_each_on_a_job_of_its_own(
    redis_server: RedisServer, namespace: str
) -> None:
    # serve-agl's producer under ROLLQ_TASKS_PER_JOB=3: the three rollouts of one create are one RQ job.
    store = Agl1Store(Producer(connect(redis_server.url), namespace, tasks_per_job=3), ProxySettings(model_name=MODEL))
    api = Running(store)
    try:
        _create(api, *({"input": i, "rollout_id": f"k{i}"} for i in range(3)))
        connection, k = store.connection, store.keys
        assert connection.llen(k.rq_queue) == 1
        _claim(api, "k1")
        # k0 and k2 still wait, each for a job on the queue that names it: a rollq worker or a runner can take them.
        queued = [j.decode() for j in connection.lrange(k.rq_queue, 0, -1)]
        assert len(queued) == 2
        for rid in ("k0", "k2"):
            job = connection.hget(k.task(rid), "job").decode()
            assert job in queued and connection.exists(k.rq_job(job))
        _claim(api, "k2")
        _claim(api, "k0")
        assert connection.llen(k.rq_queue) == 0
        states = api.client.get("/api/rollouts", params={"state_in": "running"}).json()
        assert sorted(r["rollout_id"].rpartition(".")[0] for r in states) == ["k0", "k1", "k2"]
    finally:
        api.stop()
