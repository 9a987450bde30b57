"""The status snapshot in Prometheus text exposition format (``rollq status --prometheus``)."""

from __future__ import annotations

from rollq.store.transitions import DURATION_BUCKETS

from .status import Snapshot


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}" if inner else ""


def render_prometheus(s: Snapshot) -> str:
    """Gauges for queue depth and in-flight work, counters for outcomes, a histogram of rollout durations."""
    ns = s.namespace
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{_labels(**labels)} {value:g}" for labels, value in samples)

    metric("rollq_queue_depth", "gauge", "Tasks waiting in the queue.", [({"namespace": ns}, s.queued)])
    metric(
        "rollq_in_flight",
        "gauge",
        "Attempts running now, by worker.",
        [({"namespace": ns, "worker": w}, n) for w, n in sorted(s.in_flight_by_worker.items())]
        or [({"namespace": ns, "worker": ""}, 0)],
    )
    metric(
        "rollq_stale_attempts",
        "gauge",
        "Running attempts past their heartbeat deadline.",
        [({"namespace": ns}, s.stale_attempts)],
    )
    metric("rollq_dead_letter", "gauge", "Tasks that failed for good.", [({"namespace": ns}, s.dead_letter)])
    metric(
        "rollq_results_stream_length",
        "gauge",
        "Entries in the results stream.",
        [({"namespace": ns}, s.results_stream_length)],
    )
    metric(
        "rollq_results_stream_bytes",
        "gauge",
        "Payload bytes (rollout JSON and id) in the results stream.",
        [({"namespace": ns}, s.results_stream_bytes)],
    )
    if s.results_oldest_age_seconds is not None:
        metric(
            "rollq_results_oldest_age_seconds",
            "gauge",
            "Age of the oldest entry in the results stream.",
            [({"namespace": ns}, s.results_oldest_age_seconds)],
        )
    metric(
        "rollq_results_lost_total",
        "counter",
        "Rollouts the hard byte limit trimmed before a consumer group got them, by group.",
        [({"namespace": ns, "group": g["name"]}, g["lost"]) for g in s.consumer_groups],
    )
    outcomes = []
    for key, value in sorted(s.counters.items()):
        status, sep, mode = key.partition(":")
        if sep and status in ("succeeded", "failed"):
            outcomes.append(({"namespace": ns, "status": status, "mode": mode or "none"}, value))
    metric("rollq_rollouts_total", "counter", "Final rollouts published, by status and mode.", outcomes)
    metric(
        "rollq_requeues_total",
        "counter",
        "Attempts sent back to the queue, by reason.",
        [({"namespace": ns, "reason": r}, n) for r, n in sorted(s.requeued.items())],
    )
    metric(
        "rollq_superseded_total",
        "counter",
        "Results from attempts that were no longer current.",
        [({"namespace": ns}, s.superseded)],
    )

    out.append("# HELP rollq_rollout_duration_seconds Time from claim to publish of final rollouts.")
    out.append("# TYPE rollq_rollout_duration_seconds histogram")
    cumulative = 0.0
    for bound in [repr(b) for b in DURATION_BUCKETS] + ["+Inf"]:
        cumulative += s.counters.get(f"duration:{bound}", 0.0)
        out.append(f"rollq_rollout_duration_seconds_bucket{_labels(namespace=ns, le=bound)} {cumulative:g}")
    out.append(f"rollq_rollout_duration_seconds_sum{_labels(namespace=ns)} {s.counters.get('duration:sum', 0.0):g}")
    out.append(f"rollq_rollout_duration_seconds_count{_labels(namespace=ns)} {cumulative:g}")
    return "\n".join(out) + "\n"
