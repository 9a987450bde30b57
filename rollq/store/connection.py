"""One way to get a Redis client, for the producer, the workers and the CLI.

URLs: ``redis://[:password@]host:port/db``, ``rediss://`` for TLS (``?ssl_cert_reqs=...``
and friends pass through to redis-py), ``unix:///path/redis.sock?password=...``,
``redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db]`` for a primary
found through Redis Sentinel (the password is the primary's; Sentinels on port 26379 unless
given; after a failover the client asks the Sentinels again),
``redis+cluster://[:password@]host:port[,host:port...]/name`` for the Redis Cluster primary that owns the slot of
cluster namespace ``{name}`` (:mod:`rollq.store.cluster`), and ``memory://[name]`` for an
in-process fake Redis (fakeredis) shared by every client of that name in the process. With no
URL, ``ROLLQ_REDIS_URL`` is used, then ``REDIS_URL``, then ``redis://localhost:6379/0`` (what
RQ, Celery and arq default to); ``memory://`` only when asked for, since its data vanishes with
the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from .cluster import SCHEME as CLUSTER_SCHEME
from .cluster import SlotConnectionPool, connect_cluster
from .packing import PACKER
from .settings import environ

if TYPE_CHECKING:
    # Imported where memory:// is asked for: fakeredis (and the numpy it imports) costs a worker a quarter
    # of a second of start-up it has no use for on a real Redis.
    import fakeredis

log = logging.getLogger(__name__)

DEFAULT_URL = "redis://localhost:6379/0"
"""The Redis used when no URL is given anywhere."""

_MEMORY_SERVERS: dict[str, fakeredis.FakeServer] = {}
_MEMORY_LOCK = threading.Lock()

# redis-py's default read timeout (5 s) would cut blocking reads short; rollq
# blocks for at most a few seconds at a time, so 30 s only catches dead peers.
_SOCKET_TIMEOUT_SECONDS = 30.0
# Enough attempts to ride out a Redis restart (about 20 s in all); the worker's own loop keeps retrying beyond that.
_RETRIES = 12
# Behind Sentinel (or a cluster) the outage is a failover: Sentinel's default down-after-milliseconds (30 s), then
# the election. About 65 s of backoff, so that a trainer's enqueue rides out a failover at default settings instead
# of raising ConnectionError in the middle of it (bench/failover.py's defaults profile: resumed after 32-35 s).
FAILOVER_RETRIES = 36
_BACKOFF_CAP_SECONDS = 2.0
CONNECT_TIMEOUT_SECONDS = 5.0
"""How long a TCP connect, or the first reply of a fresh connection, may take before the peer counts as unreachable."""


# TLS failures that say the configuration is wrong, not that the network is: OpenSSL's reason codes.
_TLS_SETUP_REASONS = frozenset(
    {
        "CERTIFICATE_VERIFY_FAILED",
        "WRONG_VERSION_NUMBER",  # rediss:// against a port that does not speak TLS
        "UNKNOWN_PROTOCOL",
        "TLSV1_ALERT_UNKNOWN_CA",  # the server does not trust our client certificate
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "NO_PROTOCOLS_AVAILABLE",
        "UNSUPPORTED_PROTOCOL",
    }
)


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def unrecoverable(error: BaseException) -> str | None:
    """Why retrying cannot fix ``error``, or None when it may be an outage worth riding out.

    A refused password, a TLS certificate that does not verify (or a TLS
    handshake the configuration rules out), and a peer that does not speak the
    Redis protocol are configuration errors: redis-py reports the TLS ones as
    ConnectionError, like a network failure, so they are told apart by cause.
    """
    for cause in _causes(error):
        if isinstance(cause, redis.AuthenticationError):
            return "Redis refused the credentials"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return "the server's TLS certificate did not verify"
        if isinstance(cause, ssl.SSLError) and getattr(cause, "reason", None) in _TLS_SETUP_REASONS:
            return f"the TLS handshake failed ({cause.reason})"
        if isinstance(cause, redis.exceptions.InvalidResponse):
            return "the server does not speak the Redis protocol"
    return None


# Replies by which Redis refuses a command it did not run, and would run later: out of memory under noeviction,
# a replica (or a primary demoted by a failover), a script running past busy-reply-threshold, a replica cut from
# its primary, a cluster slot moving. NOSCRIPT is not one: redis-py's Script loads the script and runs it again.
# CLUSTERDOWN: a Redis Cluster with a slot unserved (a primary failing over) refuses every command until it is served.
REFUSAL_WORDS = ("OOM", "READONLY", "BUSY", "MASTERDOWN", "TRYAGAIN", "LOADING", "CLUSTERDOWN")
# A refusal that goes on is logged again once per this many seconds; each refusal's start and end are always logged.
_REFUSAL_LOG_SECONDS = 60.0
_SETTLE_SECONDS = 3.0
"""A refusal within this long of the last one's end is a turn of it, logged only once it lasts this long (see
:class:`Refusals`)."""
RECENT_REFUSAL_SECONDS = 60.0
"""How long after a refusal ended a reaper holding off still names it as the cause (see :meth:`Refusals.recent`)."""


def transient_refusal(error: BaseException) -> str | None:
    """The word of a reply by which Redis refused a command it did not run and may accept later (``OOM``,
    ``READONLY``, ``BUSY``, ``MASTERDOWN``, ``TRYAGAIN``, ``LOADING``); None for anything else."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return "OOM"
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return "READONLY"
    if isinstance(error, redis.exceptions.TryAgainError):
        return "TRYAGAIN"
    if isinstance(error, redis.exceptions.MasterDownError):
        return "MASTERDOWN"
    if isinstance(error, redis.exceptions.ClusterDownError):
        return "CLUSTERDOWN"
    if isinstance(error, redis.ResponseError) and not isinstance(error, redis.exceptions.NoScriptError):
        word = str(error).split(" ", 1)[0]
        status = getattr(error, "status_code", None)
        for candidate in (status, word):
            if candidate in REFUSAL_WORDS:
                return str(candidate)
    return None


class Refusals:
    """This process's view of Redis refusing commands: one warning when a refusal starts, one when Redis accepts
    commands again, and the state in between for whoever reports it (``rollq status`` reads Redis's own).

    Every refusal's start and end are logged, however close to the last one: quieting a start line within a minute
    of the previous one (and then its end line) left a second OOM episode of 30 s, rollouts stuck, without a word.
    Two things stay quiet. A refusal that goes on is logged again once per :data:`_REFUSAL_LOG_SECONDS`. And a Redis
    at the edge of its memory refuses and accepts by turns: a refusal within :data:`_SETTLE_SECONDS` of the last
    one's end is a turn of it, logged (as a refusal of its own) only once it has lasted that long."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.reason: str | None = None
        self.episodes = 0
        self.refused_seconds = 0.0
        self._logged: float | None = None  # when the refusal in progress was last logged; None: not (yet), a turn
        self._last: tuple[str, float] | None = None  # the last refusal that ended: its reason, when it ended

    def refused(self, error: BaseException) -> None:
        with self._lock:
            now = time.monotonic()
            if self.since is None:
                self.since, self.reason = now, describe_refusal(error)
                turn = self._last is not None and now - self._last[1] < _SETTLE_SECONDS
                self._logged = None if turn else now
                line = None if turn else "start"
            elif self._logged is None:
                line = "start" if now - self.since >= _SETTLE_SECONDS else None  # a turn that did not pass
                self._logged = now if line else None
            elif now - self._logged >= _REFUSAL_LOG_SECONDS:
                self._logged, line = now, "still"
            else:
                line = None
            since, reason = self.since, self.reason
        if line == "start":
            log.warning("Redis refuses commands (%s); backing off and retrying until it accepts them", reason)
        elif line == "still":
            log.warning("Redis still refuses commands after %.0fs (%s)", now - since, describe_refusal(error))

    def accepted(self) -> None:
        """Redis ran a command it had refused (or a whole heartbeat): the refusal is over."""
        with self._lock:
            if self.since is None:
                return
            now = time.monotonic()
            took, logged = now - self.since, self._logged is not None
            self._last = (self.reason or "", now)
            self.since, self.refused_seconds = None, self.refused_seconds + took
            if logged:  # a quiet turn is part of the refusal logged before it
                self.episodes += 1
        if logged:
            log.warning("Redis accepts commands again after refusing them for %.1fs", took)

    def state(self) -> str | None:
        """The refusal in progress (its error text), or None."""
        return self.reason if self.since is not None else None

    def recent(self, within: float = RECENT_REFUSAL_SECONDS) -> str | None:
        """The refusal in progress, or the last one if it ended less than ``within`` seconds ago (its text), or None:
        what a reaper holding off names as the cause (Redis answered, refusing writes: neither stalled nor away)."""
        with self._lock:
            if self.since is not None:
                return self.reason
            if self._last is not None and time.monotonic() - self._last[1] < within:
                return self._last[0]
            return None


def describe_refusal(error: BaseException) -> str:
    """``error``'s text led by the word Redis refused with (``OOM``, ``READONLY``...): redis-py drops the word from
    the text of the errors it has a class for, so "command not allowed when used memory > 'maxmemory'" said OOM
    only to those who knew."""
    text, word = str(error), transient_refusal(error)
    return text if word is None or text.startswith(word) else f"{word}: {text}"


REFUSALS = Refusals()
"""The process-wide record of Redis refusing commands (see :class:`Refusals`)."""


# False within refusals_not_waited(): a refused command raises at once.
_WAIT_OUT_REFUSALS: ContextVar[bool] = ContextVar("rollq_wait_out_refusals", default=True)


@contextlib.contextmanager
def refusals_not_waited() -> Iterator[None]:
    """Within this block (this thread or task), a command Redis refuses for now (:func:`transient_refusal`) raises
    at once instead of being retried with backoff, and is not recorded in :data:`REFUSALS`; outages are retried
    as ever. For a call that only lends a hand and should not hold up its caller (a producer's wait reaps so that
    a run with every worker gone still ends): waiting out a full Redis there made a wait raise OutOfMemoryError
    once the retries ran out, past its own timeout."""
    token = _WAIT_OUT_REFUSALS.set(False)
    try:
        yield
    finally:
        _WAIT_OUT_REFUSALS.reset(token)


class _Retry(Retry):
    """Retry connection errors, and commands Redis refused but may accept later (:func:`transient_refusal`:
    OOM, READONLY, BUSY...), with backoff; not errors retrying cannot fix (see :func:`unrecoverable`).

    Waiting will not fix a wrong password or a certificate that does not
    verify, so the caller hears at once instead of after ~20 s. A refused command did not run, so sending
    it again is safe; a worker (unbounded retries) waits out a full Redis instead of dying.

    ``outage_retries`` (with ``retries`` -1): refusals are waited out for ever, but a connection error or timeout
    only this many times in a row. ``where`` (the Redis's address, password masked): its outages are recorded in
    :data:`OUTAGES`, which logs them.
    """

    def __init__(
        self, backoff: Any, retries: int, *, outage_retries: int | None = None, where: str | None = None
    ) -> None:
        super().__init__(backoff, retries)
        self.update_supported_errors([redis.ResponseError])
        self.outage_retries = outage_retries
        self.where = where

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False) -> Any:
        verdict = RetryVerdict(is_retryable, self.outage_retries, self.where)
        result = super().call_with_retry(do, fail, verdict, with_failure_count)
        verdict.ran()
        return result


class RetryVerdict:
    """Which errors of one command :class:`_Retry` (and the asyncio client's, :mod:`rollq.store.cluster_aio`)
    retries: a refusal Redis may lift (:func:`transient_refusal`, recorded in :data:`REFUSALS`), an outage
    (``outage_retries`` in a row at most, None: any number), not what retrying cannot fix (:func:`unrecoverable`)
    nor what ``is_retryable`` (redis-py's own) rules out. Call :meth:`ran` once the command ran. With ``where``
    (the Redis's address), the outages it retries and the command that ran after one are noted in :data:`OUTAGES`."""

    def __init__(self, is_retryable: Any = None, outage_retries: int | None = None, where: str | None = None) -> None:
        self.is_retryable = is_retryable
        self.outage_retries = outage_retries
        self.where = where
        self.refused = False
        self.outages = 0

    def __call__(self, error: Exception) -> bool:
        if isinstance(error, redis.ResponseError) and not isinstance(error, redis.ConnectionError):
            if transient_refusal(error) is None or not _WAIT_OUT_REFUSALS.get():
                return False
            self.refused = True
            REFUSALS.refused(error)
            return True
        if unrecoverable(error) is not None or (self.is_retryable is not None and not self.is_retryable(error)):
            return False
        self.outages += 1
        retried = self.outage_retries is None or self.outages <= self.outage_retries
        if retried and self.where is not None:
            OUTAGES.failed(self.where, error)
        return retried

    def ran(self) -> None:
        if self.refused:  # this very command was refused and now ran: Redis accepts writes again
            REFUSALS.accepted()
        if self.where is not None and OUTAGES.down:  # one look at a dict while Redis answers
            OUTAGES.answered(self.where)


OUTAGE_LOGGED_AFTER_SECONDS = 1.0
"""How long commands to a Redis must have failed (connection errors, retried) before :data:`OUTAGES` warns."""


class Outages:
    """This process's view of a Redis its clients wait for (those of :func:`wait_out_refusals`, a worker's): one
    warning when it loses Redis, naming the address and the error, and one line when Redis answers again, saying
    how long it was away; nothing per retry. Such a client raises nothing while it waits, so a worker whose Redis
    was down for seconds had logged nothing at all (each of its threads retried in silence).

    A connection dropped and at once replaced (Redis closed an idle one, an operator's ``CLIENT KILL``) is no
    outage: the warning waits until commands have failed for :data:`OUTAGE_LOGGED_AFTER_SECONDS` (or one timed
    out), and the line for Redis answering again comes only after a warning. A Redis shutting down closes its
    connections one by one and may still answer a command in between (0.4 s apart, measured): a warning at the first
    failure had been followed by "back after 0.4s" and a second warning."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down: dict[str, tuple[float, float, bool]] = {}
        """Each Redis not answering now (its address): since when (monotonic, wall clock), and whether that was
        logged. Read without the lock by every command that ran (:meth:`RetryVerdict.ran`)."""

    def failed(self, where: str, error: BaseException) -> None:
        """A command to ``where`` failed with ``error`` (a connection error or timeout) and is retried."""
        with self._lock:
            now = time.monotonic()
            since, wall, logged = self.down.get(where) or (now, time.time(), False)
            # A timeout is logged at once (the reply was waited for the whole socket timeout); refused or dropped
            # connections once they have gone on for OUTAGE_LOGGED_AFTER_SECONDS.
            warn = not logged and (isinstance(error, redis.TimeoutError) or now - since >= OUTAGE_LOGGED_AFTER_SECONDS)
            self.down[where] = (since, wall, logged or warn)
        if warn:
            log.warning("lost Redis at %s (%s); retrying until it answers", where, error)

    def answered(self, where: str) -> None:
        """A command to ``where`` ran: if Redis was away, it is back."""
        with self._lock:
            entry = self.down.pop(where, None)
        if entry is not None and entry[2]:
            log.info(
                "Redis is back at %s after %.1fs (away since %s)",
                where,
                time.monotonic() - entry[0],
                time.strftime("%H:%M:%S", time.localtime(entry[1])),
            )


OUTAGES = Outages()
"""The process-wide record of Redis outages its waiting clients ride out (see :class:`Outages`)."""


class Outage:
    """Rides out a Redis outage for a loop that has its own deadline: backoff, one log line per outage.

    Call :meth:`failed` from the loop's ``except`` for connection errors (it sleeps,
    or re-raises when the error is not an outage or the deadline has passed) and
    :meth:`over` after each step that reached Redis.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        self._delay = 0.1

    def failed(self, error: Exception, deadline: float | None) -> None:
        """Sleep before the next try; re-raise ``error`` if retrying cannot fix it or ``deadline`` (monotonic)
        has passed."""
        if unrecoverable(error) is not None:
            raise error
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("%s: Redis unreachable (%s); reconnecting until it is back", self.what, error)
        if deadline is not None and now >= deadline:
            raise error
        time.sleep(self._delay if deadline is None else max(0.0, min(self._delay, deadline - now)))
        self._delay = min(self._delay * 2, _BACKOFF_CAP_SECONDS)

    def over(self) -> None:
        """The last step reached Redis: log the end of an outage, if there was one."""
        if self.since is not None:
            log.warning("%s: Redis is back after %.1fs", self.what, time.monotonic() - self.since)
            self.since, self._delay = None, 0.1


def resolve_url(url: str | None = None) -> str:
    """The URL to use: the one given, else ``ROLLQ_REDIS_URL``, ``REDIS_URL`` (the environment, then ``.env``:
    :mod:`rollq.store.settings`), else ``redis://localhost:6379/0``."""
    if url:
        return url
    env = environ()
    return env.get("ROLLQ_REDIS_URL") or env.get("REDIS_URL") or DEFAULT_URL


def memory_server(name: str = "") -> fakeredis.FakeServer:
    """The process-wide fake server behind ``memory://name``."""
    import fakeredis

    with _MEMORY_LOCK:
        if name not in _MEMORY_SERVERS:
            _MEMORY_SERVERS[name] = fakeredis.FakeServer(version=(7, 0))
        return _MEMORY_SERVERS[name]


def retry_policy(retries: int = _RETRIES) -> Retry:
    """Backoff (capped at 2 s) on connection errors and timeouts, not on errors retrying cannot fix.

    ``retries=-1`` retries until Redis answers.
    """
    return _Retry(ExponentialBackoff(cap=_BACKOFF_CAP_SECONDS, base=0.05), retries)


def wait_out_refusals(client: redis.Redis, *, outage_retries: int | None = None) -> None:
    """Make ``client`` retry until Redis answers: outages, and commands Redis refuses for now (OOM, READONLY,
    BUSY...), pipelines included (redis-py re-sends a failed pipeline only for errors in its connections'
    ``retry_on_error``; :func:`transient_refusal` still decides which replies are retried). For a worker:
    its loop must outlast a full or failing-over Redis. ``outage_retries``: retry an outage (connection error,
    timeout) only this many times in a row, refusals still for ever (None: outages for ever too).

    A client that waits out outages for ever raises nothing while Redis is away, so its outages are logged for it
    (:data:`OUTAGES`: one warning when it loses Redis, one line when Redis answers again)."""
    errors = [redis.ConnectionError, redis.TimeoutError, redis.ResponseError]
    pool: Any = client.connection_pool
    client.get_connection_kwargs()["retry_on_error"] = errors
    for conn in [*getattr(pool, "_available_connections", []), *getattr(pool, "_in_use_connections", [])]:
        conn.retry_on_error = errors
    backoff = ExponentialBackoff(cap=_BACKOFF_CAP_SECONDS, base=0.05)
    where = describe_client(client) if outage_retries is None else None
    client.set_retry(_Retry(backoff, -1, outage_retries=outage_retries, where=where))


def _check_url(scheme: str, url: str) -> None:
    """Refuse a URL scheme neither client speaks (``memory`` is handled before this), and a ``redis://`` or
    ``rediss://`` database that is not a number (redis-py would take it as database 0)."""
    if scheme not in ("redis", "rediss", "unix", "redis+sentinel", CLUSTER_SCHEME):
        raise ValueError(
            f"unsupported Redis URL scheme {scheme!r} in {describe(url)!r}: "
            "use redis://, rediss://, unix://, redis+sentinel://, redis+cluster:// or memory://"
        )
    database = unquote(urlsplit(url).path).strip("/")
    if scheme in ("redis", "rediss") and database and not database.isdigit():
        raise ValueError(
            f"the database in {describe(url)!r} is {database!r}, not a number: use redis://host:port/<n> (default 0)"
        )


def process_client_name(role: str = "client") -> str:
    """``rollq-<role>:<host>:<pid>``, the name every connection of this process gives Redis (``CLIENT SETNAME``), so
    that ``CLIENT LIST`` attributes each connection to the process holding it (docs/scaling.md, connections)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64] or "host"
    return f"rollq-{role}:{host}:{os.getpid()}"


def name_connections(client: Any, name: str) -> None:
    """Every connection of ``client``'s pool gives Redis ``name`` from now on: those it opens later
    (``client_name`` of the pool's connection arguments) and the idle ones open now (dropped, to reconnect
    named on their next command). Call it before other threads use the client. A fake client is left as is."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or type(client).__module__.startswith("fakeredis"):
        return
    pool.connection_kwargs["client_name"] = name
    for connection in list(getattr(pool, "_available_connections", [])):
        connection.client_name = name
        connection.disconnect()


def default_retries(scheme: str) -> int:
    """Retries of a client for a URL of ``scheme``: a failover's worth behind Sentinel or a cluster, else a
    restart's."""
    return FAILOVER_RETRIES if scheme in ("redis+sentinel", CLUSTER_SCHEME) else _RETRIES


def connect(
    url: str | None = None,
    *,
    retries: int | None = None,
    client_name: str | None = None,
    socket_timeout: float = _SOCKET_TIMEOUT_SECONDS,
) -> redis.Redis:
    """A client for ``url`` (see the module docstring), retrying with backoff on connection errors.

    ``retries`` defaults to riding out a restart (about 20 s), or a failover behind Sentinel or a cluster (about
    65 s: :data:`FAILOVER_RETRIES`); a command-line tool that should answer at once passes fewer. Replies are
    bytes, as RQ requires.
    Its connections name themselves ``client_name`` (default :func:`process_client_name`) in ``CLIENT LIST``.
    ``socket_timeout``: how long one reply may take; the default outlasts rollq's blocking reads, a server that must
    answer within a scrape timeout (``rollq metrics``, the dashboard) passes a few seconds.
    """
    url = resolve_url(url)
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        import fakeredis

        return fakeredis.FakeRedis(server=memory_server(urlsplit(url).netloc))
    _check_url(scheme, url)
    # TCP keepalive is a TCP socket option; redis-py's unix socket connection refuses it.
    tcp_only = {} if scheme == "unix" else {"socket_keepalive": True}
    options: dict[str, Any] = {
        "retry": retry_policy(default_retries(scheme) if retries is None else retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": min(CONNECT_TIMEOUT_SECONDS, socket_timeout),
        "health_check_interval": 30,
        "client_name": client_name or process_client_name(),
        "command_packer": PACKER,  # a rollout's JSON is sent as it is, not copied (rollq/store/packing.py)
        **tcp_only,
    }
    if scheme == "redis+sentinel":
        return _via_sentinel(url, options)
    if scheme == CLUSTER_SCHEME:
        return connect_cluster(url, options)
    return redis.Redis.from_url(url, **options)


class _SentinelConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that drops itself when a read is cut short and reconnects via the Sentinels.

    redis-py's ``SentinelManagedConnection.read_response`` defaults to ``disconnect_on_error=False``
    (``Connection``'s default is True): a read cut short (RQ's SIGTERM handler raising inside a
    blocking BLMOVE, a timeout) left the reply unread on a pooled connection, and the next command
    on it read the previous command's reply (an LRANGE answered with an integer; "Wrong number of
    response items from pipeline execution"). Measured in bench/failover.py.
    """

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("disconnect_on_error", True)
        return super().read_response(*args, **kwargs)

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        # redis-py 8 reconnects a dropped connection through this method, not connect(), so it
        # retried the dead primary's address until its retries ran out (17 s measured) although the
        # Sentinels named the new primary after 3 s. Ask them again on every attempt instead.
        if retry_socket_connect and not self._sock:
            self.retry.call_with_retry(self._connect_retry, lambda error: None)
            return
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """A ``redis+sentinel://`` URL's Sentinels, service name, db and primary password; ValueError if malformed."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    password = unquote(credentials.partition(":")[2]) if credentials else None
    entries = [entry.rpartition(":") if ":" in entry else (entry, "", "26379") for entry in hosts.split(",")]
    path = [p for p in parts.path.split("/") if p]
    if (
        not path
        or len(path) > 2
        or (len(path) == 2 and not path[1].isdigit())
        or not all(host and port.isdigit() for host, _, port in entries)
    ):
        raise ValueError(
            f"expected redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db], got {describe(url)!r}"
        )
    sentinels = [(host, int(port)) for host, _, port in entries]
    return sentinels, path[0], int(path[1]) if len(path) == 2 else 0, password


def _via_sentinel(url: str, options: dict[str, Any]) -> redis.Redis:
    """A client of the primary that the Sentinels in ``url`` name; it asks them again after a failover."""
    sentinels, service, db, password = _sentinel_parts(url)
    # Sentinels answer at once or not at all: a short timeout moves on to the next one quickly.
    sentinel = Sentinel(sentinels, sentinel_kwargs={"socket_timeout": 1.0, "socket_connect_timeout": 1.0})
    return sentinel.master_for(service, db=db, password=password, connection_class=_SentinelConnection, **options)


def describe(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and error messages."""
    password = urlsplit(url).password
    if password is not None:
        url = url.replace(":" + password + "@", ":***@", 1)
    # unix:// URLs carry the password as a query parameter.
    return re.sub(r"([?&])password=[^&#]*", r"\1password=***", url)


def check_reachable(url: str | None = None, *, timeout: float = CONNECT_TIMEOUT_SECONDS) -> str:
    """PING the Redis at ``url`` once, giving up after ``timeout`` seconds; returns the URL used.

    A peer that accepts connections but never answers would otherwise hold a
    client for the read timeout times every retry (two minutes for the CLI);
    one that answers something other than Redis gets a clear error.
    Raises :class:`redis.ConnectionError` (or ``AuthenticationError``) naming the URL, password masked.
    """
    url = resolve_url(url)
    if urlsplit(url).scheme == "memory":
        return url
    connect(url)  # rejects unknown schemes with its own message
    options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": None}
    if urlsplit(url).scheme == "redis+sentinel":
        client = _via_sentinel(url, options)
    elif urlsplit(url).scheme == CLUSTER_SCHEME:
        client = connect_cluster(url, options)
    else:
        client = redis.Redis.from_url(url, **options)
    try:
        client.ping()
    except redis.AuthenticationError:
        raise
    except redis.TimeoutError as exc:
        raise redis.ConnectionError(f"no answer from {describe(url)} within {timeout:g}s") from exc
    except redis.ConnectionError:
        raise
    except redis.RedisError as exc:  # a reply that is not Redis's: some other service on that port
        raise redis.ConnectionError(f"{describe(url)} does not speak the Redis protocol ({exc})") from exc
    finally:
        client.close()
    return url


def describe_client(client: Any) -> str:
    """The URL a redis-py client points at, password masked, for start-up logs."""
    fake = sys.modules.get("fakeredis")  # not imported: no client of this process can be a fake one
    if fake is not None and isinstance(client, fake.FakeRedis):
        return "memory:// (in-process)"
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    auth = ":***@" if kwargs.get("password") else ""
    if isinstance(pool, SlotConnectionPool):
        seeds = ",".join(f"{h}:{p}" for h, p in pool.slot_owner.seeds)
        return f"{CLUSTER_SCHEME}://{auth}{seeds}/{pool.slot_owner.tag}"
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(
            f"{s.connection_pool.connection_kwargs.get('host')}:{s.connection_pool.connection_kwargs.get('port')}"
            for s in pool.sentinel_manager.sentinels
        )
        return f"redis+sentinel://{auth}{sentinels}/{pool.service_name}/{kwargs.get('db', 0)}"
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}" + ("&password=***" if auth else "")
    scheme = "rediss" if "ssl" in client.connection_pool.connection_class.__name__.lower() else "redis"
    return f"{scheme}://{auth}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def connect_async(
    url: str | None = None, *, retries: int | None = None, max_connections: int = 16, **kwargs: Any
) -> Any:
    """A ``redis.asyncio`` client for ``url``, with the same URL forms, retries and timeouts as :func:`connect`
    (``redis+cluster://``: :mod:`rollq.store.cluster_aio`).

    At most ``max_connections`` connections; more concurrent commands wait for one. ``kwargs``
    go to redis-py's connection pool (e.g. ``client_name``, default :func:`process_client_name`).
    """
    import redis.asyncio
    import redis.asyncio.retry

    url = resolve_url(url)
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        import fakeredis

        return fakeredis.FakeAsyncRedis(server=memory_server(urlsplit(url).netloc))
    _check_url(scheme, url)
    tcp_only = {} if scheme == "unix" else {"socket_keepalive": True}
    retry_class: Any = redis.asyncio.retry.Retry
    if scheme == CLUSTER_SCHEME:
        # As connect()'s clients do, a cluster's waits out CLUSTERDOWN while a failover leaves its slot unserved.
        from .cluster_aio import RefusalRetry as retry_class
    options: dict[str, Any] = {
        # A bounded pool that makes callers wait for a connection: a trainer gathering thousands
        # of coroutines must not open a connection per coroutine.
        "max_connections": max_connections,
        "timeout": None,
        "retry": retry_class(
            ExponentialBackoff(cap=_BACKOFF_CAP_SECONDS, base=0.05),
            default_retries(scheme) if retries is None else retries,
        ),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "socket_timeout": _SOCKET_TIMEOUT_SECONDS,
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "health_check_interval": 30,
        "client_name": process_client_name(),
        **tcp_only,
        **kwargs,
    }
    if scheme == "redis+sentinel":
        return _via_sentinel_async(url, options)
    if scheme == CLUSTER_SCHEME:
        from .cluster_aio import connect_cluster_async

        return connect_cluster_async(url, options)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, **options)
    return redis.asyncio.Redis(connection_pool=pool)


def _via_sentinel_async(url: str, options: dict[str, Any]) -> Any:
    """:func:`_via_sentinel` for ``redis.asyncio``: a client of the named primary, over a bounded blocking pool."""
    from redis.asyncio.connection import BlockingConnectionPool
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel
    from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
    from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection

    class BlockingSentinelPool(AsyncSentinelPool, BlockingConnectionPool):  # type: ignore[misc]
        """redis-py's Sentinel pool raises "Too many connections" past ``max_connections``; this one waits,
        as connect_async's redis:// pool does."""

    class Connection(AsyncSentinelConnection):  # type: ignore[misc]
        async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
            # As _SentinelConnection: a dropped connection asks the Sentinels for the primary again
            # rather than retrying the dead primary's address until the retries run out.
            if retry_socket_connect and not self.is_connected:
                await self.retry.call_with_retry(self._connect_retry, lambda error: asyncio.sleep(0))
                return
            await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

    sentinels, service, db, password = _sentinel_parts(url)
    sentinel = AsyncSentinel(sentinels, sentinel_kwargs={"socket_timeout": 1.0, "socket_connect_timeout": 1.0})
    return sentinel.master_for(
        service,
        db=db,
        password=password,
        connection_class=Connection,
        connection_pool_class=BlockingSentinelPool,
        **options,
    )


def wait_until_reachable(url: str | None = None, *, seconds: float, what: str = "worker") -> str:
    """:func:`check_reachable`, retried with backoff (0.1 s doubling to 5 s) for up to ``seconds`` while Redis does
    not answer, each wait logged; a worker started before its Redis (or during a failover) waits for it instead
    of exiting. Wrong credentials are not waited out. Returns the URL; raises the last error past ``seconds``."""
    url = resolve_url(url)
    deadline = time.monotonic() + seconds
    delay, waited_since = 0.1, None
    while True:
        try:
            check_reachable(url)
        except redis.AuthenticationError:
            raise
        except redis.ConnectionError as exc:
            now = time.monotonic()
            if now >= deadline:
                raise redis.ConnectionError(f"{exc} (waited {seconds:g}s for it: ROLLQ_REDIS_WAIT_SECONDS)") from exc
            if waited_since is None:
                waited_since = now
                log.warning(
                    "%s: Redis at %s does not answer (%s); waiting up to %gs for it (ROLLQ_REDIS_WAIT_SECONDS)",
                    what,
                    describe(url),
                    exc,
                    seconds,
                )
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(5.0, delay * 2)
            continue
        if waited_since is not None:
            log.warning("%s: Redis at %s answers after %.1fs", what, describe(url), time.monotonic() - waited_since)
        return url
