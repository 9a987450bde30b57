"""Agent Lightning 1.0.2's own trainer client and a calc_x-style agent against ``rollq serve-agl`` and rollq
workers, all real processes: a private redis-server, serve-agl and ``rollq worker`` from a venv with AL 1.0.2
(see agl1_venv.py), AL's ``AglRolloutManager.enqueue_and_wait_until_completed`` unchanged, a fake vLLM that
returns token ids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rollq.models.contract import Rollout
from rollq.store.keys import Keys, StreamField
from rollq.store.stats import StatsField
from tests.support.agl1_forwarder import Forwarder
from tests.support.agl1_llm import HintedVLLM
from tests.support.servers import REPO, RedisServer, free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]
KEY = "calcx-dev-key"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
INPUTS = [
    {"question": "What is 2+3? HINT=5", "result": "5"},
    {"question": "What is 1+1? HINT=3", "result": "2"},
    {"question": "What is 90-75? HINT=15", "result": "15"},
    {"question": "What is 90/(1/4)? HINT=300", "result": "360"},
]


@pytest.fixture(scope="session")
def agl1_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support import agl1_venv

    return agl1_venv.build(tmp_path_factory.mktemp("agl1"))


class Processes:
    """serve-agl and worker processes from the AL 1.0.2 venv, logs in the test's directory."""

    def __init__(self, bin_dir: Path, url: str, namespace: str, directory: Path) -> None:
        self.bin, self.url, self.namespace, self.directory = bin_dir, url, namespace, directory
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "AGL1_AGENT_CLASS": "tests.support.agl1_agents:CalcAgent",
        }

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.directory / f"{name}-{len(self.started)}.log", "wb")  # noqa: SIM115  # the process owns it
        command = [str(self.bin / "rollq"), "--url", self.url, "--namespace", self.namespace, *args]
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        self.started.append((f"{name}-{len(self.started)}", proc))
        return proc

    def server(self, port: int) -> subprocess.Popen[bytes]:
        proc = self._start(
            "serve-agl",
            ["serve-agl", "--port", str(port), "--key", KEY, "--model-name", MODEL, "--unresponsive-seconds", "4"],
        )
        wait_until(lambda: _healthy(port), f"serve-agl on {port}", timeout=60)
        return proc

    def worker(self, concurrency: int = 4) -> subprocess.Popen[bytes]:
        return self._start(
            "worker",
            ["worker", "--agent", "rollq.compat.agl1:Agl1Agent", "-c", str(concurrency), "--heartbeat-seconds", "1"],
        )

    def controller(self, port: int) -> subprocess.Popen[bytes]:
        """AL 1.0.2's own ``agl-controller`` (local runner: one Python subprocess per rollout)."""
        log = open(self.directory / f"agl-controller-{len(self.started)}.log", "wb")  # noqa: SIM115
        command = [
            str(self.bin / "agl-controller"),
            "runner_type=local",
            f"agl_server.url=http://127.0.0.1:{port}",
            f"agl_server.key={KEY}",
            "local_runner.poll_interval=1",
            f"hydra.run.dir={self.directory / 'hydra'}",
        ]
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.directory)
        self.started.append((f"agl-controller-{len(self.started)}", proc))
        return proc

    def stop(self) -> None:
        for name, proc in self.started:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            print(f"--- {name} ---\n{(self.directory / f'{name}.log').read_text(errors='replace')[-3000:]}")


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def agl1(
    agl1_bin: Path, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> Iterator[tuple[Processes, HintedVLLM]]:
    fake = HintedVLLM().start()
    processes = Processes(agl1_bin, redis_server.url, namespace, tmp_path)
    try:
        yield processes, fake
    finally:
        processes.stop()
        fake.stop()


def _drive(bin_dir: Path, url: str, fake: HintedVLLM, directory: Path) -> subprocess.Popen[str]:
    (directory / "inputs.json").write_text(json.dumps(INPUTS))
    return subprocess.Popen(
        [
            str(bin_dir / "python"),
            str(REPO / "tests" / "support" / "agl1_driver.py"),
            url,
            KEY,
            MODEL,
            fake.url,
            str(directory / "inputs.json"),
            str(directory / "completed.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _decode(ids: list[int]) -> str:
    return "".join(chr(i - 1000) for i in ids)


def _check_completed(completed: list[dict[str, Any]], fake: HintedVLLM) -> None:
    """Every rollout succeeded with two triplets whose ids are what the model server sent; reward on the last."""
    assert len(completed) == 2 * len(INPUTS)
    sent = {(tuple(s.prompt_token_ids), tuple(s.token_ids)) for s in fake.sent.values()}
    by_question: dict[str, list[float | None]] = {}
    for rollout in completed:
        assert rollout["rollout_state"] == "succeeded", rollout["error_message"]
        triplets = rollout["triplets"]
        assert len(triplets) == 2
        for triplet in triplets:
            assert (tuple(triplet["prompt"]["token_ids"]), tuple(triplet["response"]["token_ids"])) in sent
            assert triplet["response"]["log_probs"] is not None  # train mode asks for logprobs, as AL's proxy does
        assert triplets[0]["reward"] is None
        assert triplets[1]["reward"] == rollout["final_reward"]
        question = rollout["input"]["question"]
        assert question in _decode(triplets[0]["prompt"]["token_ids"])
        hint = question.split("HINT=")[1]
        assert _decode(triplets[1]["response"]["token_ids"]) == f"### ANSWER: {hint} ###"
        by_question.setdefault(question, []).append(rollout["final_reward"])
    expected = {row["question"]: 1.0 if row["question"].endswith(f"HINT={row['result']}") else 0.0 for row in INPUTS}
    assert by_question == {q: [r, r] for q, r in expected.items()}
    # Every call went upstream as AL's proxy sends it: the served model's name and the train temperature.
    assert {(body.get("model"), body.get("temperature")) for body in fake.received} == {(MODEL, 1.0)}


def test_agl_rollout_manager_completes_calc_agent_with_exact_token_ids_and_reward_on_last_triplet(
    agl1: tuple[Processes, HintedVLLM], agl1_bin: Path, tmp_path: Path
) -> None:
    processes, fake = agl1
    port = free_port()
    processes.server(port)
    processes.worker()
    driver = _drive(agl1_bin, f"http://127.0.0.1:{port}", fake, tmp_path)
    output, _ = driver.communicate(timeout=240)
    assert driver.returncode == 0, output[-3000:]
    _check_completed(json.loads((tmp_path / "completed.json").read_text()), fake)


def test_worker_agents_wait_out_a_proxy_pause_and_resume(
    agl1: tuple[Processes, HintedVLLM], agl1_bin: Path, tmp_path: Path
) -> None:
    """``/proxy/pause`` reaches the agents in rollq workers: their calls get 429 + Retry-After (the openai SDK
    waits and retries) and nothing reaches the model server until ``/proxy/resume``; then all complete."""
    processes, fake = agl1
    port = free_port()
    processes.server(port)
    processes.worker()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {KEY}"})
    assert client.post("/proxy/pause", json={"retry_after_seconds": 2, "reason": "weight sync"}).json()["paused"]
    driver = _drive(agl1_bin, f"http://127.0.0.1:{port}", fake, tmp_path)
    time.sleep(6.0)  # agents started and were refused meanwhile (6 retries, 2 s apart, outlast it)
    assert fake.received == []
    assert client.get("/proxy/state").json()["paused"] is True
    client.post("/proxy/resume")
    output, _ = driver.communicate(timeout=240)
    assert driver.returncode == 0, output[-3000:]
    _check_completed(json.loads((tmp_path / "completed.json").read_text()), fake)


def _results(connection: redis.Redis, namespace: str) -> list[Rollout]:
    entries = connection.xrange(Keys(namespace).results)
    return [Rollout.model_validate_json(fields[StreamField.ROLLOUT.encode()]) for _, fields in entries]


def test_rollouts_complete_after_serve_agl_and_a_worker_are_killed_mid_run(
    agl1: tuple[Processes, HintedVLLM], agl1_bin: Path, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Two serve-agl hosts behind a balancer; SIGKILL one host and the worker while rollouts run, restart both,
    then SIGKILL and restart the other host: AL's trainer client never notices, every rollout completes."""
    processes, fake = agl1
    fake.delay = 0.7  # each call takes a while, so rollouts are running when the kill comes
    ports = [free_port(), free_port()]
    servers = [processes.server(port) for port in ports]
    balancer = Forwarder(ports).start()
    worker = processes.worker()
    connection = redis_server.client()
    driver = _drive(agl1_bin, f"http://127.0.0.1:{balancer.port}", fake, tmp_path)
    try:
        running: Callable[[], bool] = lambda: bool(  # noqa: E731
            [k for k in connection.scan_iter(f"{{{namespace}}}:task:*") if connection.hget(k, "state") == b"running"]
        )
        wait_until(running, "a rollout running", timeout=120)
        time.sleep(1.0)  # its agent is in the middle of its LLM calls
        servers[0].send_signal(signal.SIGKILL)
        worker.send_signal(signal.SIGKILL)
        servers[0].wait(10)
        worker.wait(10)
        processes.worker()
        servers[0] = processes.server(ports[0])
        time.sleep(2.0)
        servers[1].send_signal(signal.SIGKILL)
        servers[1].wait(10)
        servers[1] = processes.server(ports[1])
        output, _ = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
        balancer.stop()
    assert driver.returncode == 0, output[-3000:]
    _check_completed(json.loads((tmp_path / "completed.json").read_text()), fake)
    # Nothing lost and nothing twice: one published outcome per rollout, and the worker's death cost attempts.
    results = _results(connection, namespace)
    assert len(results) == 2 * len(INPUTS) == len({r.rollout_id for r in results})
    assert max(int(r.metadata["attempt"]) for r in results) >= 2


def test_agl_controller_runs_rollouts_of_serve_agl_unchanged(
    agl1: tuple[Processes, HintedVLLM], agl1_bin: Path, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """AL's own agl-controller as the runner (no rollq worker): it PATCHes the rollouts, its agents call
    serve-agl's rollout-addressed proxy and post their rewards there; AL's trainer client reads the same
    triplets, and rollq publishes each rollout with triplets read from its events."""
    processes, fake = agl1
    port = free_port()
    processes.server(port)
    processes.controller(port)
    driver = _drive(agl1_bin, f"http://127.0.0.1:{port}", fake, tmp_path)
    output, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, output[-3000:]
    _check_completed(json.loads((tmp_path / "completed.json").read_text()), fake)
    results = _results(redis_server.client(), namespace)
    assert len(results) == 2 * len(INPUTS)
    # The controller took each rollout under the id serve-agl listed it with (its attempt's token inside) and
    # sent every write with it: none was refused.
    assert int(redis_server.client().hget(Keys(namespace).stats, StatsField.GATEWAY_REFUSED) or 0) == 0
    sent = {tuple(s.token_ids) for s in fake.sent.values()}
    for rollout in results:
        assert rollout.metadata["worker"] == "agl-controller" and rollout.triplets is not None
        assert [tuple(t.response["token_ids"]) in sent for t in rollout.triplets] == [True, True]
        assert rollout.final_reward == rollout.triplets[-1].reward
