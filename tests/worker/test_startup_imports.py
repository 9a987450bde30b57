"""A worker starts cheap: what it does not need before its first claim is imported when first needed.

bench/startup.py measures exec -> first claim against a stock RQ worker; these tests pin the imports that
made the difference, so that a convenience import at the top of a module cannot quietly bring them back.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry import trace

from rollq.models.contract import LLM, PromptTemplate
from rollq.worker.capture.gate import CallGate
from rollq.worker.capture.on_demand import OnDemandCapture

# Not needed before a worker's first claim: the capturing proxy's HTTP stack (only when an attempt has an LLM
# endpoint), fakeredis and the numpy it pulls in (only for memory:// URLs), and the operators' side.
NOT_AT_START = ["aiohttp", "httptools", "fakeredis", "numpy", "prometheus_client", "rq_dashboard", "flask", "rollq.ops"]


def _imported_by(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


@pytest.mark.parametrize(
    "statement",
    [
        "import rollq.worker.rq_worker",
        # What `rq worker -w rollq.worker.RolloutWorker` does.
        "from rq.utils import import_attribute; import_attribute('rollq.worker.RolloutWorker')",
        "from rollq.worker import LitAgent, emit_reward, llm_call_span",
    ],
)
def test_importing_the_worker_leaves_out_what_its_first_claim_does_not_need(statement: str) -> None:
    modules = _imported_by(statement)
    assert [m for m in NOT_AT_START if m in modules] == []


def test_the_capture_package_imports_its_proxy_only_when_asked_for() -> None:
    modules = _imported_by("import rollq.worker.capture.spans, rollq.worker.capture as c; c.CallKind")
    assert "aiohttp" not in modules and "httptools" not in modules and "rollq.worker.capture.proxy" not in modules
    modules = _imported_by("from rollq.worker.capture import CaptureProxy")
    assert "httptools" in modules


def test_an_attempt_without_an_llm_endpoint_starts_no_proxy_and_gets_a_copy_of_its_resources() -> None:
    capture = OnDemandCapture()
    resources = {"prompt": PromptTemplate(template="{x}", engine="f-string")}
    given, attempt = capture.open_attempt(
        resources, trace.set_span_in_context(trace.INVALID_SPAN), trace.get_tracer("t")
    )
    assert attempt is None and capture.proxy is None
    assert given == resources and given is not resources  # the cached resources are shared by every attempt


def test_the_first_attempt_with_an_llm_endpoint_starts_the_proxy_and_later_ones_share_it() -> None:
    capture = OnDemandCapture()
    resources = {"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}
    parent = trace.set_span_in_context(trace.INVALID_SPAN)
    try:
        first, attempt = capture.open_attempt(resources, parent, trace.get_tracer("t"))
        proxy = capture.proxy
        assert attempt is not None and proxy is not None
        assert first["llm"].endpoint.startswith(f"http://127.0.0.1:{proxy.port}/")
        second, _ = capture.open_attempt(resources, parent, trace.get_tracer("t"))
        assert capture.proxy is proxy and second["llm"].endpoint != first["llm"].endpoint  # own address each
        assert resources["llm"].endpoint == "http://127.0.0.1:9/v1"
    finally:
        capture.stop()
    assert capture.proxy is None


def test_a_pause_that_closes_the_gate_before_the_proxy_starts_holds_once_it_runs() -> None:
    """A worker follows weight-sync pauses from its start, before any attempt has started its proxy."""
    gate = CallGate()
    capture = OnDemandCapture(gate=gate)
    assert gate.close(3).closed_for == 3 and not gate.is_open  # no proxy, no loop yet
    parent = trace.set_span_in_context(trace.INVALID_SPAN)
    try:
        capture.open_attempt({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}, parent, trace.get_tracer("t"))
        assert capture.proxy is not None and not gate.is_open and gate.read().closed_for == 3
        gate.open("v2")
        assert gate.is_open and gate.version == "v2"
    finally:
        capture.stop()
