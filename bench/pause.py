"""Weight-sync pauses with 1000 rollouts in flight on two stock worker processes: pause-to-drained, resume-to-call.

A simulated inference server (the demo's, on a thread of this process, latency uniform in 0.5-1.5 x
``--latency`` per call) counts the calls it is answering. Two ``rq worker`` processes run
``--in-flight`` rollouts between them (``bench.agents:ProxiedLLMAgent``: the ``openai`` client, one call after
another, through each worker's capturing proxy). Once the server has most of them in flight, each round:

1. ``producer.pause_llm()``: its ``seconds_to_drained`` (workers see the pause at their next heartbeat, then the
   calls they have running finish: the longest call sets the pace), the gate's own share of it (from the last
   call ending at the server to the pause returning), and the calls the server still had running when it
   returned (must be 0);
2. holds the pause ``--hold`` seconds (a weight load), counting calls that reach the server meanwhile (must be
   0), then ``update_resources`` as a trainer would;
3. ``producer.resume_llm()``: the time from the resume to the first call reaching the server, and until the
   server has half as many calls in flight as before the pause again.

Then, with the rollouts cancelled and no call running, ``--rounds`` more pauses: their time is the workers' time
to see a pause alone. Run for each of ``--settings``: the workers' heartbeat interval, and whether they listen
on the gate's channel (they see a pause at once) or only see it at their heartbeat (a lag of up to one interval).

    python bench/pause.py [--in-flight 1000] [--latency 5] [--rounds 3] [--hold 2]
                          [--settings 5:listen,5:heartbeat,1:heartbeat]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import private_redis, rollq_workers, write_result  # noqa: E402
from rollq.models.contract import LLM  # noqa: E402
from rollq.ops.sim_llm import SimulatedLLM  # noqa: E402
from rollq.producer import Producer  # noqa: E402

PROCESSES = 2


class CountingLLM(SimulatedLLM):
    """The simulated LLM, counting the calls it is answering and noting when each arrives."""

    def __init__(self, latency: tuple[float, float]) -> None:
        super().__init__(latency=latency)
        self.in_flight = 0
        self.arrived = 0
        self.last_arrival = 0.0
        self.last_finish = 0.0
        self._lock = threading.Lock()

    async def _chat(self, request: web.Request) -> web.Response:
        with self._lock:
            self.in_flight += 1
            self.arrived += 1
            self.last_arrival = time.monotonic()
        try:
            return await super()._chat(request)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.last_finish = time.monotonic()


def _wait(check: Any, timeout: float, what: str, progress: Any = None) -> float:
    started = next_report = time.monotonic()
    while not check():
        now = time.monotonic()
        if now - started > timeout:
            raise RuntimeError(f"{what} not within {timeout}s")
        if progress is not None and now >= next_report:
            print(f"  {now - started:5.1f}s: {progress()}", flush=True)
            next_report = now + 10
        time.sleep(0.005)
    return time.monotonic() - started


def run_setting(
    server: Any, llm: CountingLLM, heartbeat: float, listen: bool, args: argparse.Namespace, log_dir: Path
) -> dict:
    namespace = f"pause-{heartbeat:g}-{'listen' if listen else 'heartbeat'}"
    producer = Producer.from_url(server.url, namespace)
    producer.update_resources({"llm": LLM(endpoint=llm.url, model="sim")})
    workers = rollq_workers(
        server.url,
        namespace,
        PROCESSES,
        agent="bench.agents:ProxiedLLMAgent",
        concurrency=args.in_flight // PROCESSES,
        log_dir=log_dir,
        extra_env={
            "ROLLQ_HEARTBEAT_SECONDS": str(heartbeat),
            "ROLLQ_GRACE_SECONDS": "0",
            "ROLLQ_LLM_GATE_LISTEN": "1" if listen else "0",
        },
    )
    rounds: list[dict[str, Any]] = []
    try:
        workers.wait_registered(server.client(), namespace)
        tasks = producer.enqueue_many([{"i": i, "turns": 100_000} for i in range(args.in_flight)], mode="train")
        target = int(0.8 * args.in_flight)
        connection = server.client()

        def progress() -> str:
            running = connection.zcard(producer.keys.inflight)
            return f"{llm.in_flight} calls at the server, {running} rollouts running, {llm.arrived} calls so far"

        ramp = _wait(lambda: llm.in_flight >= target, 300, f"{target} calls in flight", progress)
        how = "listening" if listen else "heartbeat only"
        print(f"heartbeat {heartbeat:g}s, {how}: {llm.in_flight} calls in flight after {ramp:.1f}s", flush=True)
        for number in range(args.rounds):
            time.sleep(args.gap)
            before = llm.in_flight
            report = producer.pause_llm(timeout=120)
            returned = time.monotonic()
            at_return = llm.in_flight
            arrived = llm.arrived
            time.sleep(args.hold)
            during_hold = llm.arrived - arrived
            status = producer.llm_gate_status()
            producer.update_resources({"llm": LLM(endpoint=llm.url, model="sim")})
            producer.resume_llm()
            seen = arrived + during_hold
            first = _wait(lambda seen=seen: llm.arrived > seen, 60, "a call after the resume")  # type: ignore[misc]
            half = _wait(lambda half=before / 2: llm.in_flight >= half, 120, "half the calls back in flight")  # type: ignore[misc]
            row = {
                "round": number + 1,
                "calls_in_flight_before": before,
                "seconds_to_drained": round(report.seconds_to_drained, 3),
                # The gate's own share: from the last call ending at the server to the pause returning.
                "last_call_end_to_drained_s": round(returned - llm.last_finish, 3),
                "workers": report.workers,
                "calls_at_server_when_drained": at_return,
                "calls_reaching_server_while_paused": during_hold,
                "calls_waiting_at_gates": status.waiting,
                "resume_to_first_call_ms": round(first * 1000, 1),
                "resume_to_half_in_flight_s": round(first + half, 3),
            }
            rounds.append(row)
            print(json.dumps(row), flush=True)
        producer.cancel([t.rollout_id for t in tasks])
        # With no call running, a pause's time is the workers' time to see it: the channel, or a heartbeat.
        _wait(lambda: llm.in_flight == 0 and connection.zcard(producer.keys.inflight) == 0, 120, "the fleet idle")
        idle = []
        for _ in range(args.rounds):
            with producer.weight_sync(timeout=60) as report:
                idle.append(round(report.seconds_to_drained, 3))
            time.sleep(0.5)
    finally:
        workers.stop(timeout=60)
    drained = [r["seconds_to_drained"] for r in rounds]
    lags = [r["last_call_end_to_drained_s"] for r in rounds]
    first_calls = [r["resume_to_first_call_ms"] for r in rounds]
    return {
        "heartbeat_seconds": heartbeat,
        "listening": listen,
        "in_flight": args.in_flight,
        "processes": PROCESSES,
        "seconds_to_drained_p50": round(statistics.median(drained), 3),
        "seconds_to_drained_max": max(drained),
        "last_call_end_to_drained_s_p50": round(statistics.median(lags), 3),
        "last_call_end_to_drained_s_max": max(lags),
        "idle_pause_seconds": idle,
        "resume_to_first_call_ms_p50": round(statistics.median(first_calls), 1),
        "resume_to_first_call_ms_max": max(first_calls),
        "load_average": [round(v, 1) for v in os.getloadavg()],  # the 1/5/15-minute load: this box is shared
        "violations": sum(r["calls_at_server_when_drained"] + r["calls_reaching_server_while_paused"] for r in rounds),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=1000, help="rollouts in flight (default 1000)")
    parser.add_argument("--latency", type=float, default=5.0, help="mean seconds per LLM call (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="pauses per setting (default 3)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds each pause is held (default 2)")
    parser.add_argument("--gap", type=float, default=4.0, help="seconds between pauses (default 4)")
    parser.add_argument(
        "--settings",
        default="5:listen,5:heartbeat,1:heartbeat",
        help="worker heartbeat (s) and how workers see a pause (listen: the gate's channel too; heartbeat: only it), "
        "comma-separated (default 5:listen,5:heartbeat,1:heartbeat)",
    )
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="rollq-bench-pause-"))
    print(f"worker logs in {log_dir}", flush=True)
    settings = []
    with private_redis() as server, CountingLLM(latency=(0.5 * args.latency, 1.5 * args.latency)) as llm:
        for setting in args.settings.split(","):
            heartbeat, _, how = setting.partition(":")
            settings.append(run_setting(server, llm, float(heartbeat), how != "heartbeat", args, log_dir))
    argv = [f"--in-flight={args.in_flight}", f"--latency={args.latency}", f"--rounds={args.rounds}"]
    argv += [f"--hold={args.hold}", f"--gap={args.gap}", f"--settings={args.settings}"]
    path = write_result("pause", {"settings": vars(args), "results": settings}, argv)
    print(json.dumps([{k: v for k, v in s.items() if k != "rounds"} for s in settings], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
