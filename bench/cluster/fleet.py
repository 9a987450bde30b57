"""The fleet: stock ``rq worker -w rollq.worker.RolloutWorker`` processes, their memory and their first claims."""

from __future__ import annotations

import sys
from typing import Any

import psutil

from bench.common import RQ, worker_env

WORKER_MB = 55
"""Memory one more mock-LLM `rq worker` process (concurrency 4) takes: 51 MB unique (USS) measured, 69 MB resident
counting the shared libraries again; with some margin."""
AGENT = "bench.agents:MockLLMAgent"


def worker_command(url: str, name: str, namespace: str) -> list[str]:
    return [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--name", name, "--quiet", namespace]


def fleet_env(concurrency: int, **extra: str) -> dict[str, str]:
    """A worker's environment: the mock-LLM agent (3 turns x U(0.1, 0.5) s with spans) at ``concurrency``."""
    return worker_env(ROLLQ_AGENT=AGENT, ROLLQ_CONCURRENCY=str(concurrency), **extra)


def check_memory(processes: int) -> None:
    """Refuse to start when the worker processes would not fit in the memory available now."""
    needed = processes * WORKER_MB + 1024
    available = psutil.virtual_memory().available / 2**20
    if available < needed:
        sys.exit(
            f"{processes} worker processes need about {needed / 1024:.1f} GB ({WORKER_MB} MB each and 1 GB to "
            f"spare); only {available / 1024:.1f} GB is available"
        )


def worker_memory(processes: list[psutil.Process]) -> dict[str, float]:
    """Median and max RSS and USS of the worker processes, in MB."""
    rss: list[float] = []
    uss: list[float] = []
    for p in processes:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss.append(info.rss / 2**20)
        uss.append(info.uss / 2**20)
    if not rss:
        return {}
    rss.sort()
    uss.sort()
    return {
        "rss_median": round(rss[len(rss) // 2], 1),
        "rss_max": round(rss[-1], 1),
        "uss_median": round(uss[len(uss) // 2], 1),
        "uss_max": round(uss[-1], 1),
        "uss_total": round(sum(uss)),
    }


def first_claim_summary(first_claims: list[float]) -> dict[str, Any]:
    """Seconds from each worker's start to its first claim: how many, min, median, p95, max."""
    first_claims = sorted(first_claims)
    if not first_claims:
        return {"workers": 0, "min": None, "median": None, "p95": None, "max": None}
    return {
        "workers": len(first_claims),
        "min": round(first_claims[0], 2),
        "median": round(first_claims[len(first_claims) // 2], 2),
        "p95": round(first_claims[min(len(first_claims) - 1, int(0.95 * len(first_claims)))], 2),
        "max": round(first_claims[-1], 2),
    }
