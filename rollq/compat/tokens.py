"""Attempt tokens: what a gateway hands out with an attempt and requires with every post for it.

Shared by ``serve-al`` (:mod:`rollq.compat.gateway`) and ``serve-agl`` (:mod:`rollq.compat.agl1`). A token is
an HMAC-SHA256 of ``<rollout_id>|<attempt>`` under a secret every gateway of the namespace shares (created once
in Redis at :attr:`~rollq.store.keys.Keys.gateway_secret`), cut to ``length`` hex digits: any gateway of the
namespace checks a token another one handed out, a restart loses nothing, and an attempt a rollq worker claimed
(which no gateway handed out) has a token nobody was given. A refused post is counted in the namespace's stats
hash (``gateway:refused``), which ``rollq status`` and ``/metrics`` show.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import redis

from rollq.models.errors import AttemptTokenError
from rollq.store.keys import Keys
from rollq.store.stats import StatsField

TOKEN_HEX_DIGITS = 32
"""serve-al's token length (128 bits)."""


class AttemptTokens:
    """Mint and check one namespace's attempt tokens (thread-safe; the secret is read from Redis once)."""

    def __init__(self, connection: redis.Redis, keys: Keys, length: int = TOKEN_HEX_DIGITS) -> None:
        if not 16 <= length <= 64:
            raise ValueError("an attempt token has 16 to 64 hex digits")
        self.connection, self.keys, self.length = connection, keys, length
        self._secret: bytes | None = None

    def _key(self) -> bytes:
        if self._secret is None:
            name = self.keys.gateway_secret
            self.connection.set(name, secrets.token_hex(32), nx=True)
            raw = self.connection.get(name)
            if not raw:
                raise redis.RedisError(f"the gateway secret {name} vanished")
            self._secret = raw if isinstance(raw, bytes) else str(raw).encode()
        return self._secret

    def token(self, rollout_id: str, attempt: int) -> str:
        """The token of one attempt, as handed out with it and required with its posts."""
        mac = hmac.new(self._key(), f"{rollout_id}|{attempt}".encode(), hashlib.sha256)
        return mac.hexdigest()[: self.length]

    def matches(self, rollout_id: str, attempt: int, token: str) -> bool:
        """Whether ``token`` is the one of this attempt (constant time)."""
        return hmac.compare_digest(self.token(rollout_id, attempt).encode(), token.encode())

    def check(self, rollout_id: str, attempt: int, token: str) -> None:
        """AttemptTokenError (counted) unless ``token`` is the one handed out with this attempt."""
        if not self.matches(rollout_id, attempt, token):
            self.refused()
            raise AttemptTokenError(
                f"attempt {attempt} of {rollout_id} was not handed out with this token; the post is refused"
            )

    def refused(self) -> None:
        """Count a refused post (``gateway:refused`` in the stats hash)."""
        self.connection.hincrby(self.keys.stats, StatsField.GATEWAY_REFUSED, 1)
