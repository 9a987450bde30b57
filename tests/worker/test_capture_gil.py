"""The GIL switch interval while the capturing proxy runs: lowered to 1 ms (or the worker's setting), a lower one
kept, put back on stop."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import fakeredis
import pytest
from opentelemetry import trace
from opentelemetry.context import Context

from rollq.models.contract import LLM
from rollq.worker import LitAgent
from rollq.worker.capture import CaptureProxy
from rollq.worker.capture.gil import SWITCH_INTERVAL_SECONDS
from rollq.worker.config import InvalidSettingError, WorkerSettings
from rollq.worker.rq_worker import RolloutWorker


@pytest.fixture
def interval() -> Iterator[None]:
    saved = sys.getswitchinterval()
    yield
    sys.setswitchinterval(saved)


def test_a_running_proxy_lowers_the_switch_interval_and_a_stopped_one_puts_it_back(interval: None) -> None:
    sys.setswitchinterval(0.005)  # CPython's default
    proxy = CaptureProxy().start()
    try:
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_SECONDS)
    finally:
        proxy.stop()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_shorter_interval_set_by_the_user_is_kept(interval: None) -> None:
    sys.setswitchinterval(0.0002)
    proxy = CaptureProxy().start()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    finally:
        proxy.stop()
    assert sys.getswitchinterval() == pytest.approx(0.0002)


def test_a_proxy_told_to_leave_it_leaves_it(interval: None) -> None:
    sys.setswitchinterval(0.005)
    proxy = CaptureProxy(switch_interval=None).start()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        proxy.stop()


class _Noop(LitAgent):
    async def training_rollout_async(self, task_input: object, rollout_id: str, resources: object) -> float:
        return 1.0


@pytest.mark.parametrize(("setting_ms", "expected"), [(None, SWITCH_INTERVAL_SECONDS), (0.25, 0.00025), (0, 0.005)])
def test_a_worker_gives_its_proxy_the_switch_interval_of_its_setting(
    interval: None, setting_ms: float | None, expected: float
) -> None:
    """ROLLQ_CAPTURE_SWITCH_INTERVAL_MS: 1 ms unless set; 0 leaves the interpreter's (a CPU-bound worker's choice)."""
    sys.setswitchinterval(0.005)
    overrides = {} if setting_ms is None else {"capture_switch_interval_ms": setting_ms}
    worker = RolloutWorker(
        ["gil"], connection=fakeredis.FakeRedis(), agent=_Noop(), settings=WorkerSettings.from_env({}, **overrides)
    )
    worker.bootstrap(logging_level="WARNING")
    try:
        capture = worker._capture
        assert capture is not None and capture.proxy is None  # the proxy starts with the first LLM resource
        _, attempt = capture.open_attempt(
            {"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}, Context(), trace.get_tracer(__name__)
        )
        assert attempt is not None and capture.proxy is not None
        assert sys.getswitchinterval() == pytest.approx(expected)
        attempt.close()
    finally:
        worker.teardown()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_negative_switch_interval_setting_is_refused_naming_the_variable() -> None:
    with pytest.raises(InvalidSettingError, match="ROLLQ_CAPTURE_SWITCH_INTERVAL_MS"):
        WorkerSettings.from_env({"ROLLQ_CAPTURE_SWITCH_INTERVAL_MS": "-1"})
