"""Agent Lightning 0.1.2, 0.2.2 and 0.3.0, the real packages (each in a venv of the test's own, see al_venv.py),
run by stock rollq workers against a fake vLLM: every release's reward API lands on the triplet, 0.2/0.3 agents
and ``@rollout`` functions run as they are, and AL's APO client, which finds its model through
``OPENAI_API_BASE``, is captured with token ids at 16 rollouts in flight per worker."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollq.models.contract import LLM, PromptTemplate, Rollout
from rollq.producer import Producer
from tests.support.al_venv import REPO, env
from tests.support.fake_vllm import FakeVLLM
from tests.support.servers import RedisServer, WorkerProcess, free_port

# The first run builds the AL venvs inside the fixtures (0.2.2 and 0.3.0: ~800 MB each, many minutes on a busy
# machine); later runs find them in the cache.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(1800)]

CALC_TASKS = [
    {"question": "What is 2 + 3?", "result": "5"},
    {"question": "What is 4 * 6?", "result": "24"},
    {"question": "What is 10 - 7?", "result": "3"},
    {"question": "What is 9 + 9?", "result": "19"},  # a wrong ground truth: the model's 18 scores 0
    {"question": "What is 6 * 7?", "result": "42"},
]
CALC_REWARDS = [1.0, 1.0, 1.0, 0.0, 1.0]


def calc(body: dict[str, Any]) -> str | None:
    """A model that does the arithmetic of the last user message right, in calc_x's answer format."""
    found = re.search(r"(\d+)\s*([+*-])\s*(\d+)", str(body["messages"][-1]["content"]))
    if found is None:
        return None
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    return f"### ANSWER: {a + b if op == '+' else a * b if op == '*' else a - b} ###"


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    server = FakeVLLM(answer=calc).start()
    yield server
    server.stop()


def run_workers(
    bin_dir: Path,
    redis: RedisServer,
    tmp_path: Path,
    agents: dict[str, str],
    inputs: list[Any],
    resources: dict[str, Any],
    *,
    extra_env: dict[str, str] | None = None,
) -> dict[str, list[Rollout]]:
    """One worker per agent (started together, each on a namespace of its own) running ``inputs``, the last one
    in mode ``val`` (AL's ``validation_rollout*`` paths), the others in ``train``."""
    started: list[tuple[str, Producer, list[str], WorkerProcess]] = []
    for name, spec in agents.items():
        producer = Producer.from_url(redis.url, f"t-{uuid.uuid4().hex[:10]}")
        producer.update_resources(resources)
        tasks = [*producer.enqueue_many(inputs[:-1], mode="train"), producer.enqueue(inputs[-1], mode="val")]
        ids = [t.rollout_id for t in tasks]
        worker_env = {
            "ROLLQ_AGENT": spec,
            "ROLLQ_CONCURRENCY": "4",
            "ROLLQ_GRACE_SECONDS": "0",
            # AL 0.2/0.3 import LiteLLM, which otherwise spends ~10 s retrying a download of its price list.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **(extra_env or {}),
        }
        log = tmp_path / f"worker-{name}.log"
        worker = WorkerProcess(redis.url, producer.keys.namespace, log, env=worker_env, rq=bin_dir / "rq")
        started.append((name, producer, ids, worker))
    found: dict[str, list[Rollout]] = {}
    try:
        for name, producer, ids, _ in started:
            # Generous: importing AL 0.2/0.3 (LiteLLM's proxy server among it) is ~10 s of CPU per worker, and the
            # workers start together on a machine that may be busy.
            found[name] = producer.wait(ids, timeout=600)
    finally:
        for name, _, _, worker in started:
            worker.stop(timeout=30)
            print(f"--- worker {name} ---\n{worker.log()[-3000:]}")
    return found


def assert_rewarded_calls(fake: FakeVLLM, rollouts: list[Rollout], rewards: list[float]) -> None:
    for rollout, expected in zip(rollouts, rewards, strict=True):
        assert rollout.metadata["status"] == "succeeded", rollout.metadata
        [triplet] = rollout.triplets or []
        sent = fake.sent[triplet.metadata["response_id"]]
        assert triplet.prompt["token_ids"] == sent.prompt_token_ids
        assert triplet.response["token_ids"] == sent.token_ids
        assert (triplet.reward, rollout.final_reward) == (expected, expected)
        assert "reward_missing" not in rollout.metadata


# -- Agent Lightning 0.1.2 -----------------------------------------------------------------------------------


def test_calc_x_rewards_from_al01_reward_decorator_equal_agent_lightning_0_1_2s_own(
    al_bin: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    # Both behind AL 0.1's patched vLLM, whose ids are top-level (response_token_ids: one list per choice).
    old = FakeVLLM(answer=calc, old_vllm=True).start()
    try:
        tasks_file, own_file = tmp_path / "tasks.json", tmp_path / "own.json"
        tasks_file.write_text(json.dumps(CALC_TASKS))
        script = str(REPO / "tests" / "support" / "al_real.py")
        own_log = tmp_path / "al-own.log"
        with own_log.open("wb") as out:
            own = subprocess.Popen(
                [str(al_bin / "python"), script, "own", old.url, str(tasks_file), str(own_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env(AL_OWN_PORT=str(free_port())),
                cwd=tmp_path,  # AgentOps writes agentops.log where it runs
            )
            try:
                returncode = own.wait(timeout=300)
            finally:
                if own.poll() is None:
                    own.kill()
                print(f"--- AL 0.1.2's own run ---\n{own_log.read_text(errors='replace')[-4000:]}")
        assert returncode == 0
        theirs = json.loads(own_file.read_text())
        ours = run_workers(
            al_bin,
            redis_server,
            tmp_path,
            {"calc_x": "tests.support.al_real:CalcXAgent"},
            CALC_TASKS,
            {"main_llm": LLM(endpoint=old.url, model="fake-model")},
        )["calc_x"]
    finally:
        old.stop()
    assert [r["final_reward"] for r in theirs] == CALC_REWARDS
    assert [r.final_reward for r in ours] == CALC_REWARDS
    assert_rewarded_calls(old, ours, CALC_REWARDS)
    # The same exact token ids as AL's own triplets, one triplet per rollout in both.
    for mine, al in zip(ours, theirs, strict=True):
        [triplet], [al_triplet] = mine.triplets or [], al["triplets"]
        assert triplet.prompt["token_ids"] == al_triplet["prompt"]["token_ids"]
        assert triplet.response["token_ids"] == al_triplet["response"]["token_ids"]
        assert triplet.reward == al_triplet["reward"]


def test_agent_lightnings_apo_client_via_openai_api_base_is_captured_with_ids_at_16_in_flight(
    al_bin: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    fake = FakeVLLM(delay=0.3).start()  # slow enough that the worker holds 16 rollouts at once
    try:
        prompts = [{"prompt": f"What is the capital of country {i}?"} for i in range(48)]
        [rollouts] = run_workers(
            al_bin,
            redis_server,
            tmp_path,
            {"apo": "tests.support.al_real:ApoAgent"},
            prompts,
            {"system_prompt": PromptTemplate(template="You are a helpful assistant.", engine="f-string")},
            extra_env={"OPENAI_API_BASE": fake.url, "OPENAI_API_KEY": "sk-apo", "ROLLQ_CONCURRENCY": "16"},
        ).values()
        in_flight = fake.max_in_flight
    finally:
        fake.stop()
    print(f"APO client: {len(prompts)} rollouts, at most {in_flight} calls at the model at once")
    assert in_flight >= 12, in_flight
    for prompt, rollout in zip(prompts, rollouts, strict=True):
        assert rollout.metadata["status"] == "succeeded", rollout.metadata
        [triplet] = rollout.triplets or []  # its own call, not a neighbour's
        assert triplet.prompt["messages"][-1] == {"role": "user", "content": prompt["prompt"]}
        sent = fake.sent[triplet.metadata["response_id"]]
        assert (triplet.prompt["token_ids"], triplet.response["token_ids"]) == (sent.prompt_token_ids, sent.token_ids)
        assert triplet.metadata["resource"] == "$OPENAI_API_BASE"
        assert rollout.final_reward == float(len(sent.text))
    assert {a for a in fake.authorizations} == {"Bearer sk-apo"}


# -- Agent Lightning 0.2.2 and 0.3.0 --------------------------------------------------------------------------

NEW_AGENTS = {
    "rollout": "tests.support.al_new_real:RolloutAgent",
    "rollout_async": "tests.support.al_new_real:AsyncRolloutAgent",
    "legacy": "tests.support.al_new_real:LegacyAgent",
    "function": "tests.support.al_new_real:rollout_function",
    "async_function": "tests.support.al_new_real:async_rollout_function",
}


@pytest.mark.parametrize("release", ["0.2.2", "0.3.0"])
def test_al02_and_al03_agents_run_as_they_are_and_their_emit_reward_lands(
    release: str, request: pytest.FixtureRequest, redis_server: RedisServer, fake: FakeVLLM, tmp_path: Path
) -> None:
    bin_dir = request.getfixturevalue("al02_bin" if release == "0.2.2" else "al03_bin")
    found = run_workers(
        bin_dir,
        redis_server,
        tmp_path,
        NEW_AGENTS,
        CALC_TASKS,
        {"main_llm": LLM(endpoint=fake.url, model="fake-model")},
    )
    for name, rollouts in found.items():
        print(name, [r.final_reward for r in rollouts])
        assert_rewarded_calls(fake, rollouts, CALC_REWARDS)


@pytest.mark.parametrize("release", ["0.2.2", "0.3.0"])
def test_a_proxy_llm_with_an_api_key_reaches_al_rollout_functions_addressed_by_rollout_and_attempt(
    release: str, request: pytest.FixtureRequest, redis_server: RedisServer, fake: FakeVLLM, tmp_path: Path
) -> None:
    bin_dir = request.getfixturevalue("al02_bin" if release == "0.2.2" else "al03_bin")
    proxy_llm = {"resource_type": "proxy_llm", "endpoint": fake.url, "model": "fake-model", "api_key": "sk-proxy"}
    found = run_workers(
        bin_dir,
        redis_server,
        tmp_path,
        {"function": NEW_AGENTS["function"], "async_function": NEW_AGENTS["async_function"]},
        CALC_TASKS[:2],
        {"main_llm": proxy_llm},
    )
    for rollouts in found.values():
        assert_rewarded_calls(fake, rollouts, CALC_REWARDS[:2])
    assert set(fake.authorizations) == {"Bearer sk-proxy"}
