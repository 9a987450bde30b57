"""What crosses the wire is JSON; Redis AUTH and TLS come through the URL.

Jobs naming other functions (JSON or pickled) and payload size limits are
covered in test_bad_input.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rollq.models.policy import RolloutPolicy
from rollq.producer.producer import Producer
from rollq.store.jobs import ROLLOUT_FUNC
from rollq.store.keys import Keys
from tests.support.fault_agents import assert_exactly_once
from tests.support.servers import ROLLQ, free_port, require_redis_server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


def test_jobs_task_records_and_results_are_json_never_pickle(redis_server, namespace, workers):
    # Retrying an agent exception makes a requeue job ("-r1") too, written by Lua rather than by the producer.
    policy = RolloutPolicy(retry_on=frozenset({"exception"}), max_attempts=2)
    producer = Producer.from_url(redis_server.url, namespace, policy=policy)
    ids = [producer.enqueue({"sleep": 0}).rollout_id, producer.enqueue({"raise": "again"}).rollout_id]
    workers(redis_server.url, namespace, env=AGENT)
    producer.wait(ids, timeout=30)
    connection = producer.connection

    jobs = {
        producer.keys.job_id(ids[0]): ids[0],
        producer.keys.job_id(ids[1]): ids[1],
        producer.keys.job_id(ids[1], after_attempt=1): ids[1],
    }
    for jid, rid in jobs.items():
        data = zlib.decompress(connection.hget(Keys.rq_job(jid), "data"))
        assert not data.startswith(b"\x80"), f"job {jid} is pickled"  # every pickle protocol >= 2 starts so
        func, _, args, kwargs = json.loads(data)
        assert (func, kwargs) == (ROLLOUT_FUNC, {})
        assert args == [rid]
        [(_, result)] = wait_until(lambda: connection.xrange(f"rq:results:{jid}"), f"RQ's result of {jid}", timeout=10)  # noqa: B023
        if jid == producer.keys.job_id(ids[1], after_attempt=1):
            # The task's last attempt failed: a failed RQ job, the error as its exception info (JSON all the same).
            assert b"return_value" not in result
            shown = zlib.decompress(base64.b64decode(result[b"exc_string"])).decode()
            # The agent's traceback (what rq-dashboard shows), ending at the error.
            assert shown.startswith("Traceback (most recent call last)") and "RuntimeError: again" in shown
        else:
            assert json.loads(base64.b64decode(result[b"return_value"]))["rollout_id"] == args[0]
    for rid in ids:
        record = connection.hgetall(producer.keys.task(rid))
        assert json.loads(record[b"task"])["rollout_id"] == rid
        json.loads(record[b"policy"])
    for _, fields in connection.xrange(producer.keys.results):
        json.loads(fields[b"rollout"])


def test_redis_auth_through_the_url_works_end_to_end(own_redis, namespace, workers):
    server = own_redis(password="s3cret")
    producer = Producer.from_url(server.url, namespace)
    workers(server.url, namespace, env=AGENT)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * 5)]

    assert {r.metadata["status"] for r in producer.wait(ids, timeout=30)} == {"succeeded"}
    assert_exactly_once(producer.connection, namespace, ids)


def test_wrong_or_missing_password_is_an_authentication_error(own_redis, namespace):
    server = own_redis(password="s3cret")
    for url in (f"redis://:wrong@127.0.0.1:{server.port}/0", f"redis://127.0.0.1:{server.port}/0"):
        with pytest.raises(redis.AuthenticationError):
            Producer.from_url(url, namespace).enqueue({"sleep": 0})


def test_cli_with_a_wrong_password_exits_3_with_one_line(own_redis):
    server = own_redis(password="s3cret")
    result = subprocess.run(
        [ROLLQ, "--url", f"redis://:wrong@127.0.0.1:{server.port}/0", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "credentials" in result.stderr
    assert "Traceback" not in result.stderr and "wrong" not in result.stderr


@pytest.fixture
def tls_redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server that speaks only TLS, with a self-signed certificate; yields a ``rediss://`` URL verifying it."""
    binary = require_redis_server()
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed, so no certificate can be made for a TLS redis-server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    log = tmp_path / "redis.log"
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path), "--logfile", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}"
    try:
        probe = redis.Redis.from_url(url, socket_connect_timeout=1)
        for _ in range(100):
            if process.poll() is not None:
                pytest.skip(f"this redis-server was built without TLS support (it exited: see {log})")
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail(f"the TLS redis-server on port {port} did not answer; see {log}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_tls_through_a_rediss_url_works_end_to_end(tls_redis_url, namespace, workers):
    producer = Producer.from_url(tls_redis_url, namespace)
    workers(tls_redis_url, namespace, env=AGENT)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * 5)]

    assert {r.metadata["status"] for r in producer.wait(ids, timeout=30)} == {"succeeded"}
    assert_exactly_once(producer.connection, namespace, ids)
