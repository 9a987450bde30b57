"""A benchmark profile's rollq settings with the defaults resolved to their values: what its figures depend on.

bench/failover.py and bench/cluster/ run with ``defaults`` and ``tuned`` profiles; each writes the settings a
profile ran with next to its figures, from here, so that "default" in a results file is a number and the two
benchmarks record the same keys the same way.
"""

from __future__ import annotations

from typing import Any


def resolved_settings(
    *, heartbeat_seconds: float | None, unresponsive_seconds: float | None, url_scheme: str = "redis"
) -> dict[str, Any]:
    """The worker's heartbeat and the tasks' policy (None: not set, the default applies) and the client's
    timeouts for a URL of ``url_scheme``, each with its value and, for the two a profile sets, where it came from."""
    from rollq.models.policy import RolloutPolicy
    from rollq.store import connection
    from rollq.worker.config import WorkerSettings

    policy = RolloutPolicy(**({} if unresponsive_seconds is None else {"unresponsive_seconds": unresponsive_seconds}))
    return {
        "worker_heartbeat_seconds": heartbeat_seconds or WorkerSettings.model_fields["heartbeat_seconds"].default,
        "heartbeat_from": "default" if heartbeat_seconds is None else "profile",
        "policy_unresponsive_seconds": policy.unresponsive_seconds,
        "unresponsive_from": "default" if unresponsive_seconds is None else "profile",
        "policy_timeout_seconds": policy.timeout_seconds,
        "policy_max_attempts": policy.max_attempts,
        "client_socket_timeout_seconds": connection._SOCKET_TIMEOUT_SECONDS,
        "client_connect_timeout_seconds": connection.CONNECT_TIMEOUT_SECONDS,
        "client_retries": connection.default_retries(url_scheme),
    }
