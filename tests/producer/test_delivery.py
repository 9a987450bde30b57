"""Delivery a trainer can trust, on a real redis-server and real worker processes (issue 12).

Re-runs are visible (generation), trimming never leaves a silent gap, the
stream is bounded in bytes, and readers ride out Redis outages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rollq.models.errors import RolloutsTrimmedError
from rollq.producer.aio import AsyncProducer
from rollq.producer.producer import Producer
from rollq.store.connection import unrecoverable
from tests.support.servers import ROLLQ, free_port, require_redis_server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


def test_a_rerun_after_a_dead_letter_requeue_carries_the_next_generation(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace)
    fine = producer.enqueue({"sleep": 0}).rollout_id
    rid = producer.enqueue({"raise": "deterministic bug"}).rollout_id
    workers(redis_server.url, namespace, env=AGENT)
    reader = iter(producer.rollouts("trainers", idle_timeout=10))
    first = {r.rollout_id: r for r in (next(reader), next(reader))}
    assert first[fine].metadata["generation"] == 1
    assert (first[rid].metadata["status"], first[rid].metadata["generation"]) == ("failed", 1)

    assert producer.requeue_dead([rid]) == [rid]
    second = next(reader)
    assert (second.rollout_id, second.metadata["status"], second.metadata["generation"]) == (rid, "failed", 2)
    assert producer.wait([rid], timeout=10)[0].metadata["generation"] == 2

    wait_until(lambda: producer.dead_letter() == [rid], "the re-run to be dead-lettered again", timeout=10)
    assert producer.requeue_dead([rid]) == [rid]
    assert next(reader).metadata["generation"] == 3


def _ids(producer: Producer, n: int, spec: dict | None = None) -> list[str]:
    return [t.rollout_id for t in producer.enqueue_many([spec or {"sleep": 0}] * n)]


@pytest.mark.slow
def test_a_consumer_group_behind_the_count_bound_loses_nothing(redis_server, namespace, workers):
    # 1000 rollouts finish before the group reads any; the count bound is 100.
    producer = Producer.from_url(redis_server.url, namespace, results_maxlen=100)
    reader = producer.rollouts("trainers", idle_timeout=2)
    reader._ensure_group()
    ids = _ids(producer, 1000)
    env = {**AGENT, "ROLLQ_RESULTS_MAXLEN": "100", "ROLLQ_CONCURRENCY": "32"}
    workers(redis_server.url, namespace, env=env)
    wait_until(
        lambda: producer.connection.hget(producer.keys.task(ids[-1]), "state") == b"succeeded", "the run", timeout=60
    )
    wait_until(lambda: all(s is not None for s in _states(producer, ids)), "every task to end", timeout=30)

    received = [r.rollout_id for r in reader]
    assert sorted(received) == sorted(ids)
    # Once the group has read them, the next publish trims the stream back to its bound.
    producer.enqueue({"sleep": 0})
    wait_until(lambda: producer.connection.xlen(producer.keys.results) <= 100, "the stream to be trimmed", timeout=30)


def _states(producer: Producer, ids: list[str]) -> list[bytes | None]:
    pipe = producer.connection.pipeline(transaction=False)
    for rid in ids:
        pipe.hget(producer.keys.task(rid), "ended")
    return pipe.execute()


@pytest.mark.slow
def test_the_hard_byte_limit_trims_a_lagging_group_and_its_reader_says_how_many_it_lost(
    redis_server, namespace, workers
):
    limit = 200_000  # about 85 rollouts of 2.3 kB; routine trimming keeps half
    producer = Producer.from_url(redis_server.url, namespace, results_max_bytes=limit)
    reader = producer.rollouts("trainers", idle_timeout=2)
    reader._ensure_group()
    ids = _ids(producer, 300, {"huge": 2000})
    env = {**AGENT, "ROLLQ_RESULTS_MAX_BYTES": str(limit), "ROLLQ_MAX_RESULT_BYTES": "10000", "ROLLQ_CONCURRENCY": "8"}
    workers(redis_server.url, namespace, env=env)
    wait_until(lambda: all(s is not None for s in _states(producer, ids)), "every task to end", timeout=60)

    connection = producer.connection
    payload = sum(len(f[b"rollout_id"]) + len(f[b"rollout"]) for _, f in connection.xrange(producer.keys.results))
    assert int(connection.hget(producer.keys.stats, "results:bytes")) == payload
    assert payload <= limit

    received: list[str] = []
    with pytest.raises(RolloutsTrimmedError) as lost:
        received += [r.rollout_id for r in reader]
    assert lost.value.group == "trainers" and lost.value.lost > 100
    assert f"{lost.value.lost} rollout(s)" in str(lost.value) and lost.value.from_id in str(lost.value)
    received += [r.rollout_id for r in reader]  # the reader carries on after saying so
    assert len(received) + lost.value.lost == len(ids)
    assert set(received) <= set(ids) and len(set(received)) == len(received)

    status = subprocess.run(
        [ROLLQ, "--url", redis_server.url, "-n", namespace, "status"], capture_output=True, text=True, timeout=60
    )
    assert f"lost {lost.value.lost} to trimming" in status.stdout, status.stdout
    assert "kB" in status.stdout and "oldest" in status.stdout


WAITER = """
import json, sys
from rollq.models.errors import RolloutTimeoutError, RolloutTrimmedError
from rollq.producer.producer import Producer
from rollq.store.connection import unrecoverable

url, namespace, ids_file = sys.argv[1:]
producer = Producer.from_url(url, namespace, results_maxlen=100)
ids = json.load(open(ids_file))
print("waiting", flush=True)
try:
    producer.wait(ids, timeout=25)
    print(json.dumps({"returned": len(ids)}))
except RolloutTrimmedError as exc:
    print(json.dumps({"trimmed": exc.rollout_ids, "received": sorted(exc.received)}))
except RolloutTimeoutError as exc:
    print(json.dumps({"timeout": exc.missing}))
"""


def test_wait_paused_while_its_rollouts_are_trimmed_reports_them_as_trimmed(redis_server, namespace, workers, tmp_path):
    producer = Producer.from_url(redis_server.url, namespace, results_maxlen=100)
    ids = _ids(producer, 1000)
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER, redis_server.url, namespace, str(tmp_path / "ids.json")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None and waiter.stdout.readline() == "waiting\n"
        time.sleep(1.0)  # past wait()'s first look at the task records
        waiter.send_signal(signal.SIGSTOP)
        workers(redis_server.url, namespace, env={**AGENT, "ROLLQ_RESULTS_MAXLEN": "100", "ROLLQ_CONCURRENCY": "32"})
        wait_until(lambda: all(s is not None for s in _states(producer, ids)), "every task to end", timeout=60)
        assert producer.connection.xlen(producer.keys.results) <= 100
        waiter.send_signal(signal.SIGCONT)
        outcome = json.loads(waiter.communicate(timeout=60)[0])
    finally:
        waiter.kill()
    assert "trimmed" in outcome, outcome
    assert len(outcome["trimmed"]) >= 850  # the stream keeps about its last 100
    assert sorted(outcome["trimmed"] + outcome["received"]) == sorted(ids)
    assert set(_states(producer, outcome["trimmed"])) != {None}


@pytest.mark.slow
def test_wait_and_a_group_reader_ride_out_a_25s_redis_restart(own_redis, namespace, workers, caplog):
    caplog.set_level(logging.WARNING, logger="rollq")
    server = own_redis(appendonly=True)
    producer = Producer.from_url(server.url, namespace)
    ids = _ids(producer, 20, {"sleep": 2})
    reader = producer.rollouts("trainers", idle_timeout=90)
    reader._ensure_group()
    worker = workers(server.url, namespace, env={**AGENT, "ROLLQ_CONCURRENCY": "4"})
    # A worker must be up before the outage: `rq worker` started while Redis is down exits at once.
    wait_until(lambda: "rollq worker" in worker.log(), "the worker to start", timeout=30)
    waited: dict[str, object] = {}

    def run_wait() -> None:
        try:
            waited["rollouts"] = producer.wait(ids, timeout=120)
        except Exception as exc:  # reported by the assertion below
            waited["error"] = exc

    waiter = threading.Thread(target=run_wait)
    waiter.start()
    restart = threading.Thread(target=server.restart, kwargs={"down_seconds": 25})
    time.sleep(0.5)
    restart.start()
    received = []
    for rollout in reader:
        received.append(rollout.rollout_id)
        if len(received) == len(ids):
            break
    restart.join()
    waiter.join(timeout=120)
    assert "error" not in waited, waited.get("error")
    assert [r.rollout_id for r in waited["rollouts"]] == ids  # type: ignore[attr-defined]
    assert sorted(received) == sorted(ids)
    told = [r.getMessage() for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert sum(m.startswith("wait:") for m in told) == 1, told  # once per outage, not once per retry


def test_unrecoverable_errors_are_told_apart_from_outages():
    def wrapped(cause: BaseException) -> redis.ConnectionError:
        try:
            raise cause
        except BaseException:
            try:
                raise redis.ConnectionError("Error 1 connecting to 127.0.0.1:6380.")  # noqa: B904 (as redis-py does)
            except redis.ConnectionError as error:
                return error

    assert unrecoverable(wrapped(ssl.SSLCertVerificationError(1, "certificate verify failed"))) is not None
    assert unrecoverable(redis.AuthenticationError("invalid password")) is not None
    assert unrecoverable(redis.exceptions.InvalidResponse("Protocol error")) is not None
    assert unrecoverable(wrapped(ConnectionRefusedError(111, "Connection refused"))) is None
    assert unrecoverable(wrapped(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))) is None
    assert unrecoverable(redis.TimeoutError("Timeout reading from socket")) is None


@pytest.fixture
def tls_server_and_a_wrong_ca(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    """A TLS-only redis-server with a self-signed certificate; yields (port, its certificate, another one)."""
    binary = require_redis_server()
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed, so no certificate can be made for a TLS redis-server")
    for name in ("server", "other"):
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / f"{name}.key"),
             "-out", str(tmp_path / f"{name}.pem"), "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(tmp_path / "server.pem"), "--tls-key-file", str(tmp_path / "server.key"),
         "--tls-ca-cert-file", str(tmp_path / "server.pem"), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path), "--logfile", str(tmp_path / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        good = redis.Redis.from_url(_tls_url(port, tmp_path / "server.pem"), socket_connect_timeout=1)
        wait_until(lambda: process.poll() is not None or _pings(good), "the TLS redis-server", timeout=10)
        if process.poll() is not None:
            pytest.skip("this redis-server was built without TLS support")
        yield port, tmp_path / "server.pem", tmp_path / "other.pem"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _tls_url(port: int, ca: Path) -> str:
    return f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_a_certificate_that_does_not_verify_fails_at_once_with_one_line(tls_server_and_a_wrong_ca, namespace):
    port, good_ca, wrong_ca = tls_server_and_a_wrong_ca
    assert Producer.from_url(_tls_url(port, good_ca), namespace).connection.ping()

    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        Producer.from_url(_tls_url(port, wrong_ca), namespace).wait(["x"], timeout=60)
    assert time.monotonic() - started < 3  # was ~17 s of retries

    started = time.monotonic()
    status = subprocess.run(
        [ROLLQ, "--url", _tls_url(port, wrong_ca), "-n", namespace, "status"], capture_output=True, text=True
    )
    assert time.monotonic() - started < 10
    assert status.returncode == 3 and len(status.stderr.strip().splitlines()) == 1, status.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in status.stderr


def _publish_copy(producer: Producer, rollout_id: str, generation: int, attempt: int) -> None:
    """What a failover leaves behind: the run a trainer already read, published again (a second stream entry)."""
    rollout = {
        "rollout_id": rollout_id,
        "final_reward": 1.0,
        "metadata": {"generation": generation, "attempt": attempt},
    }
    producer.connection.xadd(producer.keys.results, {"rollout_id": rollout_id, "rollout": json.dumps(rollout)})


def test_a_run_published_twice_reaches_each_consumer_group_reader_once_and_a_rerun_again(redis_server, namespace):
    # Issue 25: with wait_replicas=1 an identical rollout reached the trainer twice in 7 of 17 failovers, as a
    # second stream entry (a finish the failover undid, published again on the new primary).
    producer = Producer.from_url(redis_server.url, namespace)
    _publish_copy(producer, "r1", generation=1, attempt=1)
    _publish_copy(producer, "r1", generation=1, attempt=2)  # the same run, re-published after the failover
    _publish_copy(producer, "r2", generation=1, attempt=1)
    _publish_copy(producer, "r1", generation=2, attempt=3)  # a re-run after a dead-letter requeue: delivered
    got = [(r.rollout_id, r.metadata["generation"]) for r in producer.rollouts("sync", idle_timeout=0.5)]
    assert got == [("r1", 1), ("r2", 1), ("r1", 2)]
    assert producer.connection.xpending(producer.keys.results, "sync")["pending"] == 0  # the copy is acknowledged

    async def read_async() -> list[tuple[str, int]]:
        async with AsyncProducer.from_url(redis_server.url, namespace) as aio:
            return [(r.rollout_id, r.metadata["generation"]) async for r in aio.rollouts("async", idle_timeout=0.5)]

    assert asyncio.run(read_async()) == [("r1", 1), ("r2", 1), ("r1", 2)]


# Entries rollq did not write (an outside audit XADDed them): no rollout id, one that is not UTF-8.
FOREIGN = [{"foo": "bar"}, {"rollout_id": b"\xff\xfe", "rollout": "not json"}]


def test_a_wait_skips_results_entries_rollq_did_not_write(redis_server, namespace, workers):
    # Found by an outside audit: one `XADD {ns}:results * foo bar` made every wait over it raise KeyError (a
    # non-UTF-8 rollout id UnicodeDecodeError): the scan since the enqueue and the follow of the stream alike.
    producer = Producer.from_url(redis_server.url, namespace)
    scanned = _ids(producer, 2, {"sleep": 0.5})
    for entry in FOREIGN:
        producer.connection.xadd(producer.keys.results, entry)
    followed = _ids(producer, 2, {"sleep": 0.5})
    other = Producer.from_url(redis_server.url, namespace)  # queued nothing: follows the stream from its end
    got: dict[str, object] = {}

    def wait_following() -> None:
        try:
            got["followed"] = [r.rollout_id for r in other.wait(followed, timeout=30)]
        except Exception as exc:
            got["followed"] = exc

    follower = threading.Thread(target=wait_following)
    follower.start()
    time.sleep(0.5)  # its wait has read where the stream ends
    for entry in FOREIGN:
        producer.connection.xadd(producer.keys.results, entry)
    workers(redis_server.url, namespace, env=AGENT)
    assert [r.rollout_id for r in producer.wait(scanned, timeout=30)] == scanned
    follower.join(40)
    assert got["followed"] == followed

    async def wait_async() -> list[str]:
        async with AsyncProducer.from_url(redis_server.url, namespace) as aio:
            more = [t.rollout_id for t in await aio.enqueue_many([{"sleep": 2}] * 2)]
            waiting = asyncio.ensure_future(aio.wait(more, timeout=30))
            await asyncio.sleep(0.5)
            for entry in FOREIGN:
                await aio.connection.xadd(aio.keys.results, entry)
            got = [r.rollout_id for r in await waiting]
            return more + got

    more_and_got = asyncio.run(wait_async())
    assert more_and_got[:2] == more_and_got[2:]


def test_a_group_reader_hands_over_an_entry_with_a_generation_rollq_did_not_write(redis_server, namespace):
    # Found by an outside audit: metadata.generation = [1] (unhashable) made the readers' duplicate filter raise
    # TypeError, and every new reader of the group raised again on the same pending entry.
    producer = Producer.from_url(redis_server.url, namespace)
    _publish_copy(producer, "r1", generation=1, attempt=1)
    forged = {"rollout_id": "r2", "final_reward": 1.0, "metadata": {"generation": [1], "attempt": 1}}
    producer.connection.xadd(producer.keys.results, {"rollout_id": "r2", "rollout": json.dumps(forged)})
    producer.connection.xadd(producer.keys.results, {"rollout_id": "r2", "rollout": json.dumps(forged)})
    _publish_copy(producer, "r3", generation=1, attempt=1)
    got = [r.rollout_id for r in producer.rollouts("sync", idle_timeout=0.5)]
    assert got == ["r1", "r2", "r2", "r3"]

    async def read_async() -> list[str]:
        async with AsyncProducer.from_url(redis_server.url, namespace) as aio:
            return [r.rollout_id async for r in aio.rollouts("async", idle_timeout=0.5)]

    assert asyncio.run(read_async()) == ["r1", "r2", "r2", "r3"]
