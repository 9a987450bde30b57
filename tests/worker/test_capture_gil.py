"""The GIL switch interval while the capturing proxy runs: lowered to 1 ms, a lower one kept, put back on stop."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from rollq.worker.capture import CaptureProxy
from rollq.worker.capture.gil import SWITCH_INTERVAL_SECONDS


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
