"""Where the AL 1.0 API keeps what rollq's own records do not hold (all under the namespace's hash tag).

Rollouts themselves are rollq task records and results; only these are the API's own:
events posted to the server, the model registry, the log of rollouts in the order they ended
(AL's terminal cursor), the proxy's pause switch and its in-flight calls, what a client
PATCHed onto a status (``error_message``, ``k8s_job_name``), and the leases of runners' attempts.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollq.store.keys import Keys


@dataclass(frozen=True)
class Agl1Keys:
    keys: Keys

    @property
    def _prefix(self) -> str:
        # The same {namespace} hash tag as rollq's keys: one slot with the task records.
        return "{" + self.keys.namespace + "}:agl1"

    def events(self, rollout_id: str) -> str:
        """List of JSON events posted to the server for ``rollout_id`` (every attempt)."""
        return f"{self._prefix}:events:{rollout_id}"

    def status(self, rollout_id: str) -> str:
        """Hash of status fields a client PATCHed (``error_message``, ``k8s_job_name``)."""
        return f"{self._prefix}:status:{rollout_id}"

    @property
    def models(self) -> str:
        """Hash: ``JSON [model, endpoint]`` -> Model JSON."""
        return f"{self._prefix}:models"

    @property
    def terminal(self) -> str:
        """List of rollout ids in the order they ended (the index is AL's ``after`` cursor)."""
        return f"{self._prefix}:terminal"

    @property
    def terminal_read(self) -> str:
        """The last results-stream entry id already appended to :attr:`terminal`."""
        return f"{self._prefix}:terminal-read"

    @property
    def pause(self) -> str:
        """Hash: ``paused`` (0/1), ``retry_after``, ``reason``."""
        return f"{self._prefix}:pause"

    @property
    def inflight(self) -> str:
        """Sorted set of proxied calls in progress, scored by the time after which one counts as lost."""
        return f"{self._prefix}:inflight"

    @property
    def leases(self) -> str:
        """Sorted set of attempts runners hold (``rollout_id|attempt``), scored by when their lease ends."""
        return f"{self._prefix}:leases"

    @property
    def lease_limits(self) -> str:
        """Hash: ``rollout_id|attempt`` -> the time no renewal of its lease may pass (timeout + grace)."""
        return f"{self._prefix}:lease-limits"

    @property
    def claimants(self) -> str:
        """Hash: ``rollout_id|attempt`` -> the client address that claimed it."""
        return f"{self._prefix}:claimants"

    def held(self, client: str) -> str:
        """Sorted set of the attempts one client address holds, scored by when their lease ends."""
        return f"{self._prefix}:held:{client}"
