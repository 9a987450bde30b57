"""Agent Lightning's LitAgent and hook surface in rollq: constructor, trainer/runner/tracer, tracer read
methods, the ParallelWorkerBase lifecycle of hooks, and the end hook of a timed-out sync agent."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest

from rollq.models.contract import Hook, Rollout, Task
from rollq.models.policy import RolloutPolicy
from rollq.producer import Producer
from rollq.store.connection import connect
from rollq.worker import LitAgent, OtelTracer, RolloutWorker, WorkerSettings, emit_reward, llm_call_span


class SlowSyncAgent(LitAgent):
    """Sleeps (blocking) for ``task_input["sleep"]`` seconds: past the policy's timeout it is abandoned."""

    def __init__(self) -> None:
        super().__init__(trained_agents="solver")
        self.released = threading.Event()

    def training_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        self.released.wait(task_input["sleep"])
        return 1.0


class SeeingAgent(LitAgent):
    """Reports what it sees of its trainer, runner and tracer; no __init__ of its own calls super()."""

    def __init__(self) -> None:  # noqa: D107  # deliberately does not call super().__init__()
        self.seen: dict[str, Any] = {}

    def training_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        with llm_call_span("m", "p") as span:
            span.set_attribute("gen_ai.completion", "c")
        emit_reward(0.5)
        self.seen = {
            "trainer": self.trainer,
            "runner": self.runner,
            "tracer": self.tracer,
            "spans_so_far": [s.name for s in self.tracer.get_last_trace()],
        }
        return None


class Recorder(Hook):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.traces: list[list[str]] = []
        self.ends: list[Rollout] = []

    def init(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("init")

    def init_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        self.calls.append("init_worker")

    def on_rollout_end(self, task: Task, rollout: Rollout, runner: Any, tracer: Any) -> None:
        self.ends.append(rollout)
        self.traces.append([s.name for s in tracer.get_last_trace()])

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        self.calls.append("teardown_worker")

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("teardown")


def run_worker(url: str, namespace: str, agent: LitAgent, hooks: list[Hook]) -> RolloutWorker:
    worker = RolloutWorker(
        [namespace], connection=connect(url), agent=agent, hooks=hooks, settings=WorkerSettings(concurrency=2)
    )
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.work(burst=True, logging_level="WARNING")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return worker


def test_on_rollout_end_runs_when_a_sync_agent_times_out(url: str, namespace: str, caplog) -> None:
    # The abandoned agent thread is still inside the rollout's context; the end hook used to fail
    # with "RuntimeError: cannot enter context ... already entered", blamed on the hook.
    producer = Producer.from_url(url, namespace)
    rid = producer.enqueue({"sleep": 30}, policy=RolloutPolicy(timeout_seconds=0.5, max_attempts=1)).rollout_id
    agent, hook = SlowSyncAgent(), Recorder()
    try:
        run_worker(url, namespace, agent, [hook])
    finally:
        agent.released.set()
    [rollout] = producer.wait([rid], timeout=5)
    assert rollout.metadata["error"]["type"] == "AgentTimeoutError"
    assert [r.rollout_id for r in hook.ends] == [rid]
    assert hook.traces == [["rollout"]]
    assert "cannot enter context" not in caplog.text and "raised; carrying on" not in caplog.text


def test_agent_sees_its_worker_runner_and_tracer_and_hooks_get_the_rollouts_spans(url: str, namespace: str) -> None:
    producer = Producer.from_url(url, namespace)
    rid = producer.enqueue({}, mode="train").rollout_id
    agent, hook = SeeingAgent(), Recorder()
    worker = run_worker(url, namespace, agent, [hook])
    [rollout] = producer.wait([rid], timeout=5)
    assert rollout.final_reward == 0.5
    assert agent.seen["trainer"] is worker
    assert agent.seen["runner"].agent is agent and agent.seen["runner"].worker_id == worker.worker_id
    assert agent.seen["tracer"] is agent.seen["runner"].tracer
    assert agent.seen["spans_so_far"] == ["chat m", "reward"]  # the rollout root is still open then
    assert hook.traces == [["rollout", "chat m", "reward"]]
    assert hook.calls == ["init", "init_worker", "teardown_worker", "teardown"]


def test_litagent_takes_trained_agents_and_says_when_nothing_is_set() -> None:
    agent = SlowSyncAgent()
    assert agent.trained_agents == "solver"
    with pytest.raises(ValueError, match="not running in a RolloutWorker"):
        _ = agent.trainer
    with pytest.raises(ValueError, match="no runner"):
        _ = agent.runner


def test_tracer_trace_context_captures_spans_outside_a_worker() -> None:
    tracer = OtelTracer()
    with tracer.trace_context(name="local-try"):
        with llm_call_span("m", "p"):
            time.sleep(0)
        emit_reward(1.0)
    assert [s.name for s in tracer.get_last_trace()] == ["local-try", "chat m", "reward"]
