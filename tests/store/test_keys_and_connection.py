"""Key layout (one hash slot per namespace, no sharing between namespaces, RQ-valid job ids) and connect()."""

from __future__ import annotations

import inspect
import re
import uuid
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from rq.job import validate_job_id

from rollq.store.cluster_aio import AsyncSlotConnectionPool, RefusalRetry
from rollq.store.connection import RetryVerdict, connect, connect_async, describe, resolve_url
from rollq.store.keys import Keys, job_id


def rollq_keys(keys: Keys) -> list[str]:
    """Every key name ``Keys`` hands out for rollq's own data (RQ's keys, named ``rq_*``, excluded).

    Found by introspection, so a key added later is covered without touching this test.
    """
    names: list[str] = []
    for attr, member in inspect.getmembers(type(keys)):
        if (
            attr.startswith("_")
            or attr.startswith("rq_")
            or attr in ("namespace", "queue_name", "clustered", "job_prefix", "job_id")
        ):
            continue
        if isinstance(member, property):
            names.append(getattr(keys, attr))
        elif inspect.isfunction(member):
            arguments = len(inspect.signature(member).parameters) - 1  # all but self
            names.append(getattr(keys, attr)(*["some-id"] * arguments))
    return names


def test_keys_cover_every_kind_of_rollq_data() -> None:
    # Guards rollq_keys itself: were introspection to find nothing, the tests below would pass vacuously.
    keys = Keys("ns")
    found = set(rollq_keys(keys))
    assert {keys.task("some-id"), keys.results, keys.inflight, keys.resources("some-id")} <= found
    assert len(found) >= 12


@pytest.mark.parametrize("namespace", ["rollq", "a", "team-1.exp_2", "X" * 64])
def test_every_rollq_key_of_a_namespace_shares_its_hash_tag(namespace: str) -> None:
    keys = rollq_keys(Keys(namespace))
    assert all(k.startswith("{" + namespace + "}:") for k in keys), keys
    assert {key_slot(k.encode()) for k in keys} == {key_slot(namespace.encode())}


def test_two_namespaces_share_no_keys() -> None:
    a, b = Keys("exp"), Keys("exp-2")
    assert not set(rollq_keys(a)) & set(rollq_keys(b))
    assert a.rq_queue != b.rq_queue
    assert a.queue_name == "exp" and b.queue_name == "exp-2"


@pytest.mark.parametrize("namespace", ["", "a b", "a{b}", "{a", "a:b", "a/b", "ns\n", "é", "x" * 65])
def test_invalid_namespaces_are_rejected(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        Keys(namespace)


ODD_ROLLOUT_IDS = ["a b", "a:b", "a.b", "ünïcode", "x" * 200, "", "slash/and?query", "{tag}", "r-1|2"]


@pytest.mark.parametrize("rollout_id", ODD_ROLLOUT_IDS + ["plain-id_1"])
def test_job_ids_are_valid_for_rq_and_distinct_per_requeue(rollout_id: str) -> None:
    ids = [job_id("ns", rollout_id, after_attempt=n) for n in range(4)]
    for jid in ids:
        validate_job_id(jid)
        assert len(jid) <= 100
    assert len(set(ids)) == len(ids)
    assert job_id("ns", rollout_id) == ids[0]


def test_no_rollout_id_produces_another_rollouts_job_id() -> None:
    ids = ODD_ROLLOUT_IDS + ["a_b", "ab", "x", "x-r1", "x-1", "rollout-abc_1"]
    jobs = [job_id("ns", r, after_attempt=n, reissue=q) for r in ids for n in range(3) for q in (False, True)]
    assert len(set(jobs)) == len(jobs)
    # A rollout id that spells another's job id still gets a job id of its own.
    assert job_id("ns", job_id("ns", "x")) not in {job_id("ns", "x", n) for n in range(3)}


def test_the_same_rollout_id_gets_a_job_id_of_its_own_in_each_namespace() -> None:
    # RQ's job hashes (rq:job:<id>) are per database, not per namespace: two namespaces on one database that queue
    # the same rollout id must not share one.
    a, b = Keys("a"), Keys("b")
    assert a.job_id("x") != b.job_id("x")
    assert a.job_id("x", after_attempt=2, reissue=True) != b.job_id("x", after_attempt=2, reissue=True)
    # No (namespace, rollout id) pair spells another's: the namespace ends where the rollout id begins.
    assert Keys("a").job_id("b-x") != Keys("a-b").job_id("x")
    assert re.fullmatch(r"rollq-[0-9a-f]{40}-0", a.job_id("x"))
    assert re.fullmatch(r"rollq-[0-9a-f]{40}-3", a.job_id("x", after_attempt=3))
    assert re.fullmatch(r"rollq-[0-9a-f]{40}-q3", a.job_id("x", after_attempt=3, reissue=True))
    # A cluster namespace keeps its tag in front, and differs from the plain namespace of the same name.
    assert re.fullmatch(r"\{a\}rollq-[0-9a-f]{40}-0", Keys("{a}").job_id("x"))
    assert Keys("{a}").job_id("x").removeprefix("{a}") != a.job_id("x")


def test_redis_url_gives_a_tcp_pool_with_retries_and_no_connection_yet() -> None:
    client = connect("redis://user:secret@db.example:6380/3")
    pool = client.connection_pool
    assert pool.connection_class is redis.Connection
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("db.example", 6380, 3)
    assert (kwargs["username"], kwargs["password"]) == ("user", "secret")
    assert kwargs["retry"] is not None and kwargs["socket_keepalive"] is True
    pool.make_connection()  # the pool can build its connections


def _backoff_seconds(retry: Any) -> float:
    """The sleeps a redis-py Retry makes before it gives up (its backoff, once per retry)."""
    retry._backoff.reset()
    return sum(retry._backoff.compute(failures) for failures in range(1, retry._retries + 1))


def test_a_sentinel_client_rides_out_a_failover_at_sentinels_default_down_after() -> None:
    # bench/failover.py, defaults profile (down-after 30 s): work resumed after 32-35 s, and 16 enqueue_many calls
    # raised ConnectionError on the way, because a client gave up after about 15 s of backoff.
    sentinel = connect("redis+sentinel://127.0.0.1:26379/mymaster/0").connection_pool.connection_kwargs["retry"]
    plain = connect("redis://127.0.0.1:6379/0").connection_pool.connection_kwargs["retry"]
    assert _backoff_seconds(sentinel) >= 45 > _backoff_seconds(plain) >= 12


def test_a_cluster_url_gives_an_asyncio_client_with_connect_asyncs_options() -> None:
    # connect_async refused redis+cluster:// (ValueError), so an AsyncProducer could not use a cluster namespace.
    client = connect_async("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001/{run-1}", max_connections=4)
    pool = client.connection_pool
    assert isinstance(pool, AsyncSlotConnectionPool) and pool.max_connections == 4
    assert pool.slot_owner.seeds == [("10.0.0.1", 7000), ("10.0.0.2", 7001)] and pool.slot_owner.tag == "run-1"
    kwargs = pool.connection_kwargs
    assert kwargs["client_name"].startswith("rollq-client:") and kwargs["password"] == "pw"
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["socket_keepalive"]) == (30, 5, True)
    # A failover's worth of retries, as the blocking cluster client has, and CLUSTERDOWN among what they retry.
    retry = kwargs["retry"]
    assert isinstance(retry, RefusalRetry) and _backoff_seconds(retry) >= 45
    assert RetryVerdict()(redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"))
    assert not RetryVerdict()(redis.ResponseError("WRONGTYPE Operation against a key"))
    assert "redis+cluster://10.0.0.1:7000,10.0.0.2:7001/run-1" in repr(pool)
    pool.make_connection()  # the pool can build its connections


def test_rediss_url_gives_a_tls_pool_and_passes_ssl_options_through() -> None:
    pool = connect("rediss://:secret@db.example:6390/0?ssl_cert_reqs=none").connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
    assert pool.connection_kwargs["port"] == 6390
    pool.make_connection()


def test_unix_url_gives_a_socket_pool_that_can_build_its_connections() -> None:
    pool = connect("unix:///run/redis/redis.sock?password=secret&db=2").connection_pool
    assert pool.connection_class is redis.UnixDomainSocketConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["path"], kwargs["password"], kwargs["db"]) == ("/run/redis/redis.sock", "secret", 2)
    connection = pool.make_connection()
    assert connection.path == "/run/redis/redis.sock"


def test_memory_urls_share_one_fake_server_per_name() -> None:
    name = uuid.uuid4().hex
    connect(f"memory://{name}").set("k", "v")
    assert connect(f"memory://{name}").get("k") == b"v"
    assert connect(f"memory://{name}-other").get("k") is None


def test_unknown_url_scheme_is_rejected_naming_it_and_the_supported_ones() -> None:
    with pytest.raises(ValueError) as exc:
        connect("http://:hunter2@db.example:6379")
    message = str(exc.value)
    assert "'http'" in message
    for scheme in ("redis://", "rediss://", "unix://", "memory://"):
        assert scheme in message
    assert "hunter2" not in message


@pytest.mark.parametrize("url", ["redis://localhost:6379/abc", "rediss://h:6380/1x", "redis://h/0/extra"])
def test_a_database_that_is_not_a_number_is_refused_not_taken_as_db_0(url: str) -> None:
    for make in (connect, connect_async):
        with pytest.raises(ValueError, match="database"):
            make(url)


def test_rollq_redis_url_beats_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, generic = f"memory://ours-{uuid.uuid4().hex}", f"memory://generic-{uuid.uuid4().hex}"
    monkeypatch.setenv("ROLLQ_REDIS_URL", ours)
    monkeypatch.setenv("REDIS_URL", generic)
    assert resolve_url() == ours
    connect().set("written", "1")
    assert connect(ours).get("written") == b"1"
    assert connect(generic).get("written") is None
    assert resolve_url("redis://explicit:1") == "redis://explicit:1"

    monkeypatch.delenv("ROLLQ_REDIS_URL")
    assert resolve_url() == generic
    monkeypatch.delenv("REDIS_URL")
    assert resolve_url() == "redis://localhost:6379/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:s3cret@host:6379", "redis://user:***@host:6379"),
        (
            "rediss://default:s3cret@host:6380/1?ssl_cert_reqs=none",
            "rediss://default:***@host:6380/1?ssl_cert_reqs=none",
        ),
        ("unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=***"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("memory://name", "memory://name"),
    ],
)
def test_describe_hides_passwords(url: str, shown: str) -> None:
    assert describe(url) == shown
    assert "s3cret" not in describe(url)
