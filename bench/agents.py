"""The agents rollq workers run in the benchmarks (their plain RQ twins are in :mod:`bench.rq_jobs`).

Worker subprocesses import these as ``bench.agents:NoopAgent``; the benchmarks
put the repository root on their PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import random
import sys
import threading
import time
from typing import Any

from rollq.models.contract import Triplet
from rollq.worker import LitAgent, emit_reward, llm_call_span
from rollq.worker.capture.gil import SWITCH_INTERVAL_SECONDS
from rollq.worker.sample_agent import SampleAgent

TURNS = 3
TURN_SECONDS = (0.1, 0.5)
MODEL = "mock-llm"


class NoopAgent(LitAgent):
    """Returns a reward at once: what is left is rollq's own cost per rollout."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> float:
        return 1.0


class HoldAgent(LitAgent):
    """Holds its slot for ``task_input["seconds"]``: each process of a starting fleet (concurrency 1) takes one task."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> float:
        await asyncio.sleep(float(task_input["seconds"]))
        return 1.0


class SyncNoopAgent(LitAgent):
    """The sync flavour of :class:`NoopAgent` (each rollout runs on a thread of its own)."""

    def training_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> float:
        return 1.0


class MockLLMAgent(LitAgent):
    """Three turns, each an LLM call that takes 0.1-0.5 s, traced as an LLM-call span plus a reward span."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> None:
        for turn in range(TURNS):
            with llm_call_span(MODEL, f"turn {turn} of {task_input}") as span:
                await asyncio.sleep(random.uniform(*TURN_SECONDS))
                span.set_attribute("gen_ai.completion", f"answer {turn}")
            emit_reward(0.5 * turn)
        # None: rollq builds the rollout (trace, triplets, final reward) from the captured spans.
        return None


# 8 turns make ~0.23 MB of JSON per rollout; bench/big.py sets 35 for ~1 MB.
BIG_TURNS = int(os.environ.get("ROLLQ_BENCH_BIG_TURNS", "8"))
BIG_PROMPT_IDS, BIG_RESPONSE_IDS = 4096, 512
_rng = random.Random(7)
# One list per process, reused: the benchmark measures moving the ids, not drawing them.
PROMPT_IDS = [_rng.randrange(150_000) for _ in range(BIG_PROMPT_IDS)]
RESPONSE_IDS = [_rng.randrange(150_000) for _ in range(BIG_RESPONSE_IDS)]


class BigTokenAgent(LitAgent):
    """Returns at once BIG_TURNS (8) triplets of 4096 prompt + 512 response token ids (~0.23 MB of JSON per rollout)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> list[Triplet]:
        return [
            Triplet(prompt={"token_ids": PROMPT_IDS}, response={"token_ids": RESPONSE_IDS}, reward=float(t))
            for t in range(BIG_TURNS)
        ]


SLOW_TURN_SECONDS = (3.0, 10.0)


def slow_turns(task_input: Any) -> list[float]:
    """The turn lengths of a slow rollout, drawn from its task input so a simulation can replay the same list."""
    rng = random.Random(int(task_input["i"]))
    return [rng.uniform(*SLOW_TURN_SECONDS) for _ in range(TURNS)]


class SlowLLMAgent(LitAgent):
    """Three turns, each an LLM call that takes 3-10 s (seeded by the task), traced like MockLLMAgent."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> None:
        for turn, seconds in enumerate(slow_turns(task_input)):
            with llm_call_span(MODEL, f"turn {turn} of {task_input}") as span:
                await asyncio.sleep(seconds)
                span.set_attribute("gen_ai.completion", f"answer {turn}")
            emit_reward(0.5 * turn)
        return None


class ProxiedLLMAgent(LitAgent):
    """``task_input["turns"]`` chat calls through the worker's capturing proxy to the ``llm`` resource, one after
    another; for bench/pause.py, whose backend decides how long each takes.

    Plain aiohttp on one session per process, not the ``openai`` client: at 500 rollouts per process on a shared
    2-core machine, the SDK's own CPU (a client per rollout, its models per call) stalled the agent loop for
    seconds, and the benchmark measures the proxy and the pause, not the SDK."""

    _session: Any = None

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> None:
        import aiohttp

        if ProxiedLLMAgent._session is None:
            connector = aiohttp.TCPConnector(limit=0)
            ProxiedLLMAgent._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(600))
        llm = resources["llm"]
        url = f"{llm.endpoint.rstrip('/')}/chat/completions"
        for turn in range(int(task_input["turns"])):
            question = f"Compute {turn} + {task_input['i']}."
            body = {"model": llm.model, "messages": [{"role": "user", "content": question}]}
            async with self._session.post(url, json=body) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {answer}")
        return None


class GroupMemberAgent(LitAgent):
    """A group member that takes U(0.2, 0.6) s and earns a random reward in [0, 1] (``bench/batches.py``)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> float:
        await asyncio.sleep(random.uniform(0.2, 0.6))
        return random.random()


class OneClientSampleAgent(SampleAgent):
    """rollq's sample agent with a single ``openai`` client for all its rollouts (bench/sample_clients.py)."""

    clients = 1


class SwitchIntervalSampleAgent(SampleAgent):
    """rollq's sample agent in a worker process whose GIL switch interval is ``interval`` throughout (here the 1 ms
    the capturing proxy sets while it serves a call over its socket; bench/switch_interval.py): set as each rollout
    starts, after the proxy has started."""

    interval = SWITCH_INTERVAL_SECONDS

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> None:
        if sys.getswitchinterval() != self.interval:
            sys.setswitchinterval(self.interval)
        await super().training_rollout_async(task_input, rollout_id, resources)


class LongSwitchSampleAgent(SwitchIntervalSampleAgent):
    """The sample agent at the interpreter's default switch interval, 5 ms: as if the proxy left it alone."""

    interval = 0.005


class ShortSwitchSampleAgent(SwitchIntervalSampleAgent):
    """The sample agent at a switch interval of 0.25 ms, a quarter of the proxy's."""

    interval = 0.00025


class GcRecordingSampleAgent(SampleAgent):
    """rollq's sample agent that records its process's garbage collections (bench/gc_freeze.py): per generation the
    collections, their seconds (wall, and CPU of the thread collecting) and the longest, with the process's CPU
    seconds, written every second to ``$ROLLQ_BENCH_GC_DIR/<pid>.json`` (nothing without that variable). It imports
    ``openai`` when built, as an agent that imports it at module level does (the sample agent imports it at its
    first call)."""

    def __init__(self) -> None:
        import openai  # noqa: F401

        super().__init__()
        directory = os.environ.get("ROLLQ_BENCH_GC_DIR")
        self._recorder = _GcRecorder(directory) if directory else None
        if self._recorder:
            self._recorder.start()


class FrozenSampleAgent(GcRecordingSampleAgent):
    """:class:`GcRecordingSampleAgent` in a process whose start-up objects (what it has imported, ``openai`` too) are
    moved out of the collector's reach (``gc.freeze()``) when the agent is built, before the worker's own start-up
    and its first rollout: full collections then skip them."""

    def __init__(self) -> None:
        import openai  # noqa: F401

        gc.freeze()
        super().__init__()


class _GcRecorder:
    """A process's collections, summed into ``<pid>.json`` every second; each collection and each timed call also
    appended as a line to ``<pid>.events`` (``gc <wall time> <generation> <seconds>``, ``call <wall time> <seconds>``,
    ``lag <wall time> <seconds> <switch interval>``), so that the bench can keep those of its measurement window."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"{os.getpid()}.json")
        self.events: collections.deque[str] = collections.deque()
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.cpu_seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._started_cpu = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._callback)
        threading.Thread(target=self._write_every_second, daemon=True, name="gc-recorder").start()

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            self._started_cpu = time.thread_time()
            return
        generation, took = info["generation"], time.perf_counter() - self._started
        self.cpu_seconds[generation] += time.thread_time() - self._started_cpu
        self.collections[generation] += 1
        self.seconds[generation] += took
        self.longest[generation] = max(self.longest[generation], took)
        self.events.append(f"gc {time.time():.4f} {generation} {took:.6f}\n")

    def call(self, seconds: float) -> None:
        """One LLM call's time at the client less the backend's generation time."""
        self.events.append(f"call {time.time():.4f} {seconds:.6f}\n")

    def lag(self, seconds: float) -> None:
        """How late one 100 ms tick on the agents' loop ran (what rollq's executor averages into its ``lag``), and
        the process's GIL switch interval then."""
        self.events.append(f"lag {time.time():.4f} {seconds:.6f} {sys.getswitchinterval():.6f}\n")

    def _write_every_second(self) -> None:
        while True:
            time.sleep(1.0)
            cpu = sum(os.times()[:2])
            record = {
                "collections": self.collections,
                "seconds": self.seconds,
                "collector_cpu_seconds": self.cpu_seconds,
                "longest": self.longest,
                "cpu_seconds": cpu,
                "frozen": gc.get_freeze_count(),
            }
            with open(self.path + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(self.path + ".tmp", self.path)
            lines = []
            while self.events:
                lines.append(self.events.popleft())
            with open(self.path.removesuffix(".json") + ".events", "a") as f:
                f.writelines(lines)


class CallTimingSampleAgent(GcRecordingSampleAgent):
    """:class:`GcRecordingSampleAgent` that also times each LLM call at the client (its ``openai`` clients' HTTP
    hooks: request sent to response head read) less the generation time the simulated LLM reports
    (``X-Sim-Seconds``): what the path to the LLM costs the agent, in a worker as it runs (bench/agent_calls.py).

    With ``ROLLQ_BENCH_GC_THRESHOLDS=young,middle,old`` the process's collector thresholds are set to those as the
    first rollout starts (after the worker's own setting, rollq.worker.collector). With
    ``ROLLQ_BENCH_SWITCH_INTERVAL_MS=x`` the GIL switch interval is set to x ms as each rollout starts and stays
    there (at 1 ms: as the proxy kept it from its start before it lowered it only for calls over its socket). From
    its first rollout on, it also records how late each 100 ms tick on its loop runs (``lag`` events)."""

    def __init__(self) -> None:
        super().__init__()
        wanted = os.environ.get("ROLLQ_BENCH_GC_THRESHOLDS")
        self._thresholds = tuple(int(n) for n in wanted.split(",")) if wanted else None
        interval = os.environ.get("ROLLQ_BENCH_SWITCH_INTERVAL_MS")
        self._interval = float(interval) / 1000 if interval else None
        self._ticking = False

    def _tick(self, loop: Any, due: float) -> None:
        now = time.monotonic()
        if self._recorder is not None:
            self._recorder.lag(max(0.0, now - due))
        loop.call_later(0.1, self._tick, loop, now + 0.1)

    def _client_options(self) -> dict[str, Any]:
        import openai

        if self._recorder is None:
            return {}
        hooks = {"request": [self._sent], "response": [self._answered]}
        return {"http_client": openai.DefaultAsyncHttpxClient(event_hooks=hooks)}

    async def _sent(self, request: Any) -> None:
        request.extensions["rollq_bench_sent"] = time.perf_counter()

    async def _answered(self, response: Any) -> None:
        generation = response.headers.get("x-sim-seconds")
        sent = response.request.extensions.get("rollq_bench_sent")
        if generation is not None and sent is not None and self._recorder is not None:
            self._recorder.call(time.perf_counter() - sent - float(generation))

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> None:
        if self._thresholds and gc.get_threshold() != self._thresholds:
            gc.set_threshold(*self._thresholds)
        if self._interval is not None and sys.getswitchinterval() != self._interval:
            sys.setswitchinterval(self._interval)
        if not self._ticking and self._recorder is not None:
            self._ticking = True
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, self._tick, loop, time.monotonic() + 0.1)
        await super().training_rollout_async(task_input, rollout_id, resources)
