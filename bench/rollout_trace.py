"""What a rollout's trace costs: workers publishing every trace (the default) beside ``ROLLQ_ROLLOUT_TRACE=failed``.

Run: python bench/rollout_trace.py [--rounds 2] [--window 20] [--mock-in-flight 1000] [--sample-in-flight 256]

Two agents on 2 worker processes each (``bench/mock_llm.py``'s measurement, a private redis-server):

- ``mock``: bench/agents.py's MockLLMAgent, the issue's worker-CPU benchmark (three sleeps of 0.1-0.5 s in LLM-call
  spans it makes itself, a reward after each; no LLM is called);
- ``sample``: rollq's sample agent (the demo's), whose 1-2 ``openai`` calls to the simulated LLM (0.1-0.5 s) go
  through the worker's capturing proxy: each call's span repeats its messages, token ids and logprobs.

For each agent, round after round, the two settings take turns (the first alternates). Per row: rollouts/s, the
workers' and Redis's CPU per rollout, the mean bytes of a rollout's JSON on the results stream (the row's last 200),
and Redis's memory growth over the row divided by its finished rollouts (what a rollout leaves in Redis under the
default retention: stream entry, summary, task record, RQ's job). Per agent: medians of the rounds, and the ratios
``failed`` / ``all`` within each round. Writes bench/results/rollout_trace.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RedisServer, outcomes, private_redis, write_result  # noqa: E402
from bench.mock_llm import run_rollq  # noqa: E402
from rollq.store.keys import Keys, StreamField  # noqa: E402
from rollq.store.payloads import load_payloads  # noqa: E402

SETTINGS = ("all", "failed")
"""The values of ``ROLLQ_ROLLOUT_TRACE`` compared (``none`` publishes what ``failed`` does when nothing fails)."""
SAMPLED = 200
FIGURES = ("rollouts_per_s", "worker_cpu_ms_per_rollout", "redis_cpu_ms_per_rollout", "rollout_bytes",
           "redis_bytes_per_rollout")  # fmt: skip


def rollout_bytes(server: RedisServer, namespace: str, count: int = SAMPLED) -> float:
    """The mean size of the rollout JSON of the namespace's last ``count`` results-stream entries."""
    connection = server.client()
    entries = [fields for _, fields in connection.xrevrange(Keys(namespace).results, count=count)]  # type: ignore[union-attr]
    load_payloads(connection, entries)
    sizes = [len(fields[StreamField.ROLLOUT.encode()]) for fields in entries]
    return round(statistics.mean(sizes), 1) if sizes else 0.0


def one_row(server: RedisServer, agent: str, kept: str, round_: int, args: argparse.Namespace, logs: Path) -> dict:
    namespace = f"{agent}-{kept}-{round_}"
    used0 = int(server.client().info("memory")["used_memory"])
    env = {"ROLLQ_ROLLOUT_TRACE": kept}
    if agent == "mock":
        row = run_rollq(server, args.mock_in_flight, args.window, logs, namespace=namespace, system=kept,
                        extra_env=env)  # fmt: skip
    else:
        from rollq.ops.sim_llm import SimulatedLLM
        from rollq.worker.sample_agent import sample_inputs, sample_resources

        with SimulatedLLM(latency=(0.1, 0.5)) as llm:
            row = run_rollq(server, args.sample_in_flight, args.window, logs, namespace=namespace, system=kept,
                            agent="rollq.worker.sample_agent:SampleAgent", inputs=sample_inputs,
                            resources=sample_resources(temperature=0.5, endpoint=llm.url), extra_env=env,
                            mean_rollout_seconds=None)  # fmt: skip
    finished = sum(outcomes(server.client(), namespace))
    used1 = int(server.client().info("memory")["used_memory"])
    row.update(
        agent=agent,
        trace=kept,
        round=round_ + 1,
        rollout_bytes=rollout_bytes(server, namespace),
        redis_bytes_per_rollout=round((used1 - used0) / max(1, finished)),
        finished_in_row=finished,
    )
    print(
        f"    {agent} trace={kept}: {row['rollout_bytes']:,.0f} bytes per rollout, "
        f"{row['redis_bytes_per_rollout']:,} bytes of Redis memory per rollout",
        flush=True,
    )
    return row


def summary(rows: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    mine = [r for r in rows if r["agent"] == agent]
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in mine:
        by_round.setdefault(r["round"], {})[r["trace"]] = r
    ratios = {
        key: [round(pair["failed"][key] / pair["all"][key], 3) for pair in by_round.values() if pair["all"][key]]
        for key in FIGURES
    }
    return {
        "agent": agent,
        "rounds": len(by_round),
        **{
            f"{kept}_{key}": round(statistics.median(r[key] for r in mine if r["trace"] == kept), 3)
            for kept in SETTINGS
            for key in FIGURES
        },  # fmt: skip
        **{f"ratio_{key}": ratios[key] for key in FIGURES},
        **{f"ratio_{key}_median": round(statistics.median(ratios[key]), 3) for key in FIGURES if ratios[key]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of steady state to count, per row")
    parser.add_argument("--mock-in-flight", type=int, default=1000)
    parser.add_argument("--sample-in-flight", type=int, default=256)
    parser.add_argument("--agents", default="mock,sample", help="comma-separated: mock, sample")
    parser.add_argument("--out", default="rollout_trace", help="the results file's name in bench/results")
    args = parser.parse_args()
    agents = [a for a in args.agents.split(",") if a]

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollq-bench-trace-") as logs, private_redis() as server:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1} of {args.rounds}:", flush=True)
            for agent in agents:
                order = SETTINGS if round_ % 2 == 0 else SETTINGS[::-1]
                rows.extend(one_row(server, agent, kept, round_, args, Path(logs)) for kept in order)
    summaries = [summary(rows, agent) for agent in agents]
    for s in summaries:
        print(
            f"{s['agent']}: failed / all, median of rounds: "
            f"worker CPU {s.get('ratio_worker_cpu_ms_per_rollout_median')}"
            f", bytes {s.get('ratio_rollout_bytes_median')}, Redis CPU {s.get('ratio_redis_cpu_ms_per_rollout_median')}"
            f", Redis memory {s.get('ratio_redis_bytes_per_rollout_median')}",
            flush=True,
        )
    argv = sys.argv[1:]
    path = write_result(args.out, {"summary": summaries, "rows": rows}, argv, settings=vars(args))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
