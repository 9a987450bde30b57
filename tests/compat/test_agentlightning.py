"""With the real Agent Lightning 0.1.2 (installed in a venv of the test's own): its LitAgent run unchanged by
rollq workers, its objects accepted by the producer, and its client processes pulling through ``rollq serve-al``,
one of them killed mid-rollout."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import pytest

from rollq.models.contract import LLM
from rollq.models.policy import RolloutPolicy, TaskState
from rollq.producer.producer import Producer
from tests.support.al_venv import REPO, env
from tests.support.fault_agents import assert_exactly_once
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def start_worker(al_bin: Path, url: str, namespace: str, agent: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(al_bin / "rq"), "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, namespace],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env(ROLLQ_AGENT=agent, ROLLQ_GRACE_SECONDS="0", ROLLQ_CONCURRENCY="4"),
        cwd=REPO,
    )


def stop(process: subprocess.Popen[bytes], log: Path | None = None) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if log is not None:
        print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")


def test_an_agentlightning_litagent_runs_unchanged_in_a_rollq_worker(al_bin, redis_server, namespace, tmp_path):
    producer = Producer.from_url(redis_server.url, namespace)
    producer.update_resources({"main_llm": LLM(endpoint="http://llm", model="m-7")})
    train = producer.enqueue({"a": 2, "b": 3}, mode="train").rollout_id
    val = producer.enqueue({"a": 2, "b": 3}, mode="val").rollout_id
    log = tmp_path / "worker.log"
    worker = start_worker(al_bin, redis_server.url, namespace, "tests.support.al_real:CalcAgent", log)
    try:
        trained, validated = producer.wait([train, val], timeout=60)
    finally:
        stop(worker, log)
    assert trained.metadata["status"] == "succeeded", trained.metadata
    [triplet] = trained.triplets or []
    assert (triplet.response, triplet.reward, trained.final_reward) == ({"text": "5"}, 1.0, 1.0)
    assert triplet.metadata == {"model": "m-7", "trained_agents": "calc"}
    assert validated.final_reward == 0.5 and validated.metadata["validated"] is True


def test_an_async_agentlightning_agent_runs_on_the_event_loop(al_bin, redis_server, namespace, tmp_path):
    producer = Producer.from_url(redis_server.url, namespace)
    ids = [t.rollout_id for t in producer.enqueue_many([{"a": 2, "b": 3}, {"a": 1, "b": 1}], mode="train")]
    log = tmp_path / "worker.log"
    worker = start_worker(al_bin, redis_server.url, namespace, "tests.support.al_real:AsyncCalcAgent", log)
    try:
        rollouts = producer.wait(ids, timeout=60)
    finally:
        stop(worker, log)
    assert [r.final_reward for r in rollouts] == [1.0, 0.0]


def test_the_producer_accepts_agentlightnings_own_objects(al_bin, redis_server, namespace):
    script = textwrap.dedent(f"""
        from agentlightning.types import LLM, PromptTemplate, ResourcesUpdate
        from rollq.producer import Producer
        producer = Producer.from_url({redis_server.url!r}, {namespace!r})
        v1 = producer.update_resources({{"llm": LLM(endpoint="http://x", model="m"),
                                         "prompt": PromptTemplate(template="t", engine="f-string")}})
        update = ResourcesUpdate(resources_id="x", resources={{"llm": LLM(endpoint="e", model="n")}})
        v2 = producer.update_resources(update)
        print(v1, v2)
    """)
    out = subprocess.run([str(al_bin / "python"), "-c", script], capture_output=True, text=True, env=env(), cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    producer = Producer.from_url(redis_server.url, namespace)
    v1, v2 = out.stdout.split()
    assert producer.get_resources(v1).resources["llm"] == LLM(endpoint="http://x", model="m")
    assert producer.get_resources(v2).resources["llm"].model == "n"


def post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_agentlightning_clients_pull_through_serve_al_and_a_killed_one_costs_nothing(
    al_bin, redis_server, namespace, tmp_path
):
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=1, max_attempts=3, timeout_seconds=60)
    )
    producer.update_resources({"main_llm": LLM(endpoint="http://llm", model="m-al")})
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/"
    server_log = tmp_path / "serve-al.log"
    rollq = str(Path(__import__("sys").executable).parent / "rollq")
    server = subprocess.Popen(
        [
            rollq,
            "--url",
            redis_server.url,
            "-n",
            namespace,
            "serve-al",
            "--port",
            str(port),
            "--lease",
            "2",
            "--heartbeat",
            "0.3",
        ],
        stdout=server_log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env(),
        cwd=REPO,
    )
    clients: list[tuple[subprocess.Popen[bytes], Path]] = []
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        wait_until(lambda: _up(endpoint), "serve-al to answer", timeout=20)
        hang = producer.enqueue({"a": 1, "b": 1, "hang_first": True}, mode="train").rollout_id
        ids = [t.rollout_id for t in producer.enqueue_many([{"a": i, "b": 1} for i in range(12)], mode="train")]
        for i in range(2):
            log = tmp_path / f"client-{i}.log"
            clients.append(
                (
                    subprocess.Popen(
                        [str(al_bin / "python"), "tests/support/al_real.py", endpoint, str(markers)],
                        stdout=log.open("wb"),
                        stderr=subprocess.STDOUT,
                        env=env(),
                        cwd=REPO,
                    ),
                    log,
                )
            )
        marker = wait_until(lambda: next(markers.glob("hung-*"), None), "a client to take the hanging task", timeout=60)
        handed = marker.read_text()  # <rollout_id>#<attempt>#<token>
        assert handed.rpartition("#")[0] == f"{hang}#1"
        hung_pid = int(marker.name.split("-")[1])
        victim = next(p for p, _ in clients if p.pid == hung_pid)
        victim.kill()  # mid-rollout: its attempt stops being heartbeated once the 2 s lease ends
        rollouts = producer.wait([hang, *ids], timeout=90)
        by_id = {r.rollout_id: r for r in rollouts}
        assert by_id[hang].metadata["attempt"] == 2 and by_id[hang].final_reward == 2.5
        assert [by_id[rid].final_reward for rid in ids] == [i + 1 + 0.5 for i in range(12)]
        assert {r.metadata["status"] for r in rollouts} == {"succeeded"}
        assert all(r.metadata["worker"].startswith("al-client@") for r in rollouts)
        # The killed client's attempt, posted late (with its token), is recorded but never delivered.
        late = post(endpoint + "rollout", {"rollout_id": handed, "final_reward": 99.0})
        assert late["status"] == "superseded"
        assert producer.connection.xlen(producer.keys.superseded) == 1
        assert [a.outcome for a in producer.attempts(hang)] == ["released", "succeeded"]
        assert producer.task_info(hang).state == TaskState.SUCCEEDED
        assert_exactly_once(producer.connection, namespace, [hang, *ids])
        bad = urllib.request.Request(endpoint + "rollout", b'{"final_reward": 1}', {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(bad, timeout=10)
        assert info.value.code == 400 and "rollout_id" in info.value.read().decode()
    finally:
        for process, log in clients:
            stop(process, log)
        stop(server, server_log)


def _up(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "resources/latest", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
