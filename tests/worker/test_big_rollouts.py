"""A big rollout from a real worker reaches every reader whole, though its results entry only names the key that holds
it (rollq.store.payloads): the trainer's wait and consumer group, ``rollq rollouts get``/``tail``, the dashboard."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from rollq.models.contract import Rollout
from rollq.ops.cli import main
from rollq.ops.dashboard.data import rollout_page
from rollq.ops.lookup import final_rollout
from rollq.producer import Producer
from rollq.store.keys import StreamField
from rollq.store.payloads import PAYLOAD_THRESHOLD
from tests.support.rollout_agents import token_ids

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.rollout_agents:BigTokenIdsAgent", "ROLLQ_CONCURRENCY": "4"}
BIG = {"turns": 6, "ids": 4096}  # ~0.15 MB of JSON
SMALL = {"turns": 1, "ids": 8}


def assert_exact(rollout: Rollout, task_input: dict[str, Any]) -> None:
    assert rollout.metadata["status"] == "succeeded", rollout.metadata
    got = [t.prompt["token_ids"] for t in rollout.triplets or []]
    assert got == [token_ids(task_input, t) for t in range(task_input["turns"])]


def test_big_rollouts_reach_every_reader_exactly_through_their_payload_keys(redis_server, namespace, workers) -> None:
    workers(redis_server.url, namespace, env=AGENT)
    producer = Producer.from_url(redis_server.url, namespace)
    inputs = [{**(BIG if i % 3 else SMALL), "seed": i} for i in range(9)]
    ids = [t.rollout_id for t in producer.enqueue_many(inputs)]
    by_id = dict(zip(ids, inputs, strict=True))

    # The trainer's wait.
    for rollout, task_input in zip(producer.wait(ids, timeout=60), inputs, strict=True):
        assert_exact(rollout, task_input)

    # The entries: big ones name their payload key, small ones keep the rollout inline.
    entries = producer.connection.xrange(producer.keys.results)
    refs = {f[b"rollout_id"].decode(): f.get(StreamField.REF.encode()) for _, f in entries}
    for rid, task_input in by_id.items():
        assert (refs[rid] is not None) == (task_input["turns"] > 1)
        if refs[rid] is not None:
            assert producer.connection.strlen(refs[rid]) > PAYLOAD_THRESHOLD

    # A consumer group, in order of the stream.
    read = list(producer.rollouts("trainers", start="0", idle_timeout=1.0))
    assert sorted(r.rollout_id for r in read) == sorted(ids)
    for rollout in read:
        assert_exact(rollout, by_id[rollout.rollout_id])

    # rollq rollouts get / tail, the dashboard's rollout page.
    big = next(rid for rid in ids if by_id[rid]["turns"] > 1)
    assert_exact(final_rollout(producer, big), by_id[big])
    page = rollout_page(producer.connection, producer.keys, big)
    assert page is not None and not page.result_trimmed
    assert_exact(page.rollout, by_id[big])
    assert [row.prompt_tokens for row in page.triplets] == [BIG["ids"]] * BIG["turns"]
    runner = CliRunner()
    got = runner.invoke(main, ["--url", redis_server.url, "-n", namespace, "rollouts", "get", big])
    assert got.exit_code == 0, got.output
    tail = runner.invoke(
        main, ["--url", redis_server.url, "-n", namespace, "rollouts", "tail", "--from-start", "--count", "9"]
    )
    assert tail.exit_code == 0, tail.output
    tailed = [Rollout.model_validate(json.loads(line)) for line in tail.output.splitlines()]
    assert sorted(r.rollout_id for r in tailed) == sorted(ids)
    for rollout in tailed:
        assert_exact(rollout, by_id[rollout.rollout_id])
