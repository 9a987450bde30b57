"""Groups and training batches on a real Redis with stock ``rq worker`` processes: complete groups in completion
order, GRPO advantages, failed and lost members, the staleness bound, several trainers, restarts, asyncio."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

import pytest

from rollq.models.contract import LLM
from rollq.models.errors import BackpressureTimeoutError
from rollq.models.groups import GROUP_ID, GROUP_INDEX, GROUP_SIZE, membership
from rollq.models.policy import RolloutPolicy
from rollq.ops.status import group_outcomes, snapshot
from rollq.producer import BatchTimeoutError, GroupPolicy, Producer, ReaderBusyError
from rollq.producer.aio import AsyncProducer
from rollq.store.keys import Keys
from rollq.store.records import read_records
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.train_agents:GroupAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}
RESOURCES = {"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}


@pytest.fixture
def producer(redis_server, namespace) -> Producer:
    return Producer.from_url(redis_server.url, namespace)


@pytest.fixture
def serve(redis_server, namespace, workers):
    return lambda: workers(redis_server.url, namespace, env=AGENT)


def test_group_members_share_a_group_id_in_task_and_rollout_metadata(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [0.0, 1.0, 0.5]}, {"rewards": [1.0]}], mode="train", group_size=3)
    assert len(tasks) == 6
    first = [t for t in tasks if t.metadata[GROUP_ID] == tasks[0].metadata[GROUP_ID]]
    assert [t.metadata[GROUP_INDEX] for t in first] == [0, 1, 2] and {t.metadata[GROUP_SIZE] for t in first} == {3}
    assert tasks[3].metadata[GROUP_ID] != tasks[0].metadata[GROUP_ID]
    serve()
    rollouts = producer.wait([t.rollout_id for t in tasks], timeout=60)
    for task, rollout in zip(tasks, rollouts, strict=True):
        assert {k: rollout.metadata[k] for k in (GROUP_ID, GROUP_INDEX, GROUP_SIZE)} == {
            k: task.metadata[k] for k in (GROUP_ID, GROUP_INDEX, GROUP_SIZE)
        }


@pytest.mark.slow
def test_batches_hand_over_complete_groups_with_grpo_advantages(producer, serve) -> None:
    rewards = [0.0, 1.0, 1.0, 0.5]
    producer.enqueue_many([{"rewards": rewards}] * 5, mode="train", group_size=4)
    serve()
    reader = producer.batches(batch_size=2, timeout=60)
    batches = [reader.next_batch() for _ in range(2)]
    last = reader.next_batch()  # the fifth group; a partial batch once the timeout passes
    reader.close()
    groups = [g for b in batches for g in b.groups]
    assert [len(b.groups) for b in batches] == [2, 2] and not any(b.partial for b in batches)
    assert len(last.groups) == 1 and last.partial
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    for group in [*groups, *last.groups]:
        assert [membership(r.rollout_id, r.metadata).index for r in group.rollouts] == [0, 1, 2, 3]
        assert group.rewards == rewards
        assert group.advantages == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards])
    assert len({g.group_id for g in [*groups, *last.groups]}) == 5
    assert group_outcomes(snapshot(producer.connection, producer.keys).counters)["delivered"] == 5


def test_unscaled_advantages_subtract_the_mean_only(producer, serve) -> None:
    producer.enqueue_many([{"rewards": [0.0, 2.0]}], mode="train", group_size=2)
    serve()
    (group,) = producer.batches(1, timeout=60, policy=GroupPolicy(scale_rewards=False)).next_batch().groups
    assert group.advantages == [-1.0, 1.0]


@pytest.mark.slow
def test_a_group_with_a_failed_member_is_dropped_and_counted_by_default(producer, serve) -> None:
    producer.enqueue_many([{"rewards": [1.0, 0.0], "fail": [1]}, {"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    batch = producer.batches(2, timeout=20).next_batch()
    assert len(batch.groups) == 1 and batch.partial and batch.failed_dropped == 1
    assert batch.groups[0].rewards == [1.0, 0.0]
    counters = snapshot(producer.connection, producer.keys).counters
    assert group_outcomes(counters) == {"delivered": 1, "stale-dropped": 0, "stale-requeued": 0, "failed-dropped": 1}


def test_a_timeout_after_every_complete_group_was_dropped_says_so(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0], "fail": [1]}] * 2, mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    with pytest.raises(BatchTimeoutError) as timed_out:
        producer.batches(2, timeout=3).next_batch()
    assert (timed_out.value.failed_dropped, timed_out.value.stale_dropped, timed_out.value.waiting) == (2, 0, 0)
    assert "2 complete group(s) dropped (0 stale, 2 with failed members)" in str(timed_out.value)


def test_kept_failed_members_are_marked_and_left_out_of_the_advantages(producer, serve) -> None:
    producer.enqueue_many([{"rewards": [1.0, 0.0, 0.5], "fail": [0], "no_reward": [2]}], mode="train", group_size=3)
    serve()
    (group,) = producer.batches(1, timeout=60, policy=GroupPolicy(on_failure="keep")).next_batch().groups
    assert group.failed == [True, False, True]
    assert "member 0 was told to fail" in (group.failures[0] or "") and group.failures[2] == "no reward"
    assert group.rewards == [None, 0.0, None] and group.advantages == [0.0, 0.0, 0.0]


def test_a_group_whose_member_is_lost_is_settled_not_waited_on_forever(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0, 1.0]}], mode="train", group_size=3)
    # The last member vanishes before any worker sees it: its record and its job are gone.
    lost = tasks[2].rollout_id
    producer.connection.delete(producer.keys.task(lost))
    serve()
    policy = GroupPolicy(on_failure="keep", group_timeout=1.0)
    started = time.monotonic()
    (group,) = producer.batches(1, timeout=30, policy=policy).next_batch().groups
    assert time.monotonic() - started < 20
    assert group.failed == [False, False, True] and "no longer exists" in (group.failures[2] or "")
    assert group.rewards[:2] == [1.0, 0.0]


def test_groups_older_than_the_staleness_bound_are_dropped_and_counted(producer, serve) -> None:
    producer.update_resources(RESOURCES)  # v1
    old = producer.enqueue_many([{"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in old], timeout=60)
    producer.update_resources(RESOURCES)  # v2
    producer.update_resources(RESOURCES)  # v3: the v1 group is now 2 versions behind
    fresh = producer.enqueue_many([{"rewards": [0.0, 1.0]}], mode="train", group_size=2)
    batch = producer.batches(1, max_staleness=1, timeout=60).next_batch()
    (group,) = batch.groups
    assert group.group_id == fresh[0].metadata[GROUP_ID] and batch.stale_dropped == 1
    assert group.staleness(batch.latest_version) == 0 and batch.latest_version == 3
    assert group_outcomes(snapshot(producer.connection, producer.keys).counters)["stale-dropped"] == 1


def test_stale_groups_can_be_queued_again_as_new_groups(producer, serve) -> None:
    producer.update_resources(RESOURCES)
    old = producer.enqueue_many([{"rewards": [0.25, 0.75], "tag": "again"}], mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in old], timeout=60)
    producer.update_resources(RESOURCES)
    producer.update_resources(RESOURCES)
    reader = producer.batches(1, max_staleness=0, timeout=60, policy=GroupPolicy(on_stale="requeue"))
    batch = reader.next_batch()
    (group,) = batch.groups
    assert batch.stale_requeued == 1 and group.group_id != old[0].metadata[GROUP_ID]
    assert group.rewards == [0.25, 0.75] and group.versions == [3, 3]
    assert producer.get_task(group.rollouts[0].rollout_id).input == {"rewards": [0.25, 0.75], "tag": "again"}


@pytest.mark.slow
def test_two_trainer_ranks_split_the_groups_without_splitting_a_group(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}] * 12, mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    seen: list[set[str]] = []
    for rank in (0, 1):
        reader = producer.batches(20, timeout=3, rank=rank, world_size=2)
        batch = reader.next_batch()
        reader.close()
        assert all(len(g.rollouts) == 2 for g in batch.groups)
        seen.append({g.group_id for g in batch.groups})
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 12 and seen[0] and seen[1]


def test_a_trainer_that_restarts_gets_back_the_groups_it_had_not_finished(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}] * 3, mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    crashed = producer.batches(3, timeout=10, consumer="trainer-0")
    before = {g.group_id for g in crashed.next_batch().groups}
    del crashed  # dies mid-step: never asked for the next batch, never closed
    again = producer.batches(3, timeout=1, consumer="trainer-0")
    assert {g.group_id for g in again.next_batch().groups} == before
    with pytest.raises(BatchTimeoutError):
        again.next_batch()  # acknowledges the batch before: nothing is left
    again.close()
    assert producer.connection.xpending(Keys(producer.namespace).results, "batches")["pending"] == 0


def test_duplicate_deliveries_of_a_member_do_not_complete_a_group_twice(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    stream = producer.keys.results
    for _, fields in producer.connection.xrange(stream):
        producer.connection.xadd(stream, fields)  # the same rollout published twice (a retried publish)
    reader = producer.batches(1, timeout=2)
    assert len(reader.next_batch().groups) == 1
    with pytest.raises(BatchTimeoutError):
        reader.next_batch()
    assert reader.assembler.duplicates == 2


def test_a_duplicate_read_with_its_group_does_not_acknowledge_the_group_before_it_is_trained_on(
    producer, serve
) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    stream = producer.keys.results
    first = next(
        fields
        for _, fields in producer.connection.xrange(stream)
        if tasks[0].rollout_id.encode() in fields[b"rollout_id"]
    )
    producer.connection.xadd(stream, first)  # member 0 published twice, read in the same chunk as the group
    crashed = producer.batches(1, timeout=10, consumer="trainer-0")
    (group,) = crashed.next_batch().groups
    # While the trainer trains on the group, its two entries stay pending (the duplicate alone is acknowledged).
    assert producer.connection.xpending(stream, "batches")["pending"] == 2
    del crashed  # dies mid-step
    again = producer.batches(1, timeout=5, consumer="trainer-0")
    assert [g.group_id for g in again.next_batch().groups] == [group.group_id]
    again.close()
    assert producer.connection.xpending(stream, "batches")["pending"] == 0


def test_a_new_consumer_group_starts_where_this_producer_first_queued_not_at_earlier_runs(
    redis_server, namespace, serve, caplog
) -> None:
    serve()
    run1 = Producer.from_url(redis_server.url, namespace)
    old = run1.enqueue_many([{"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    run1.wait([t.rollout_id for t in old], timeout=60)
    first = run1.batches(1, timeout=10)
    first.next_batch()
    first.close()

    run2 = Producer.from_url(redis_server.url, namespace)  # a new run in the same namespace, under a new name
    new = run2.enqueue_many([{"rewards": [0.0, 1.0]}], mode="train", group_size=2)
    run2.wait([t.rollout_id for t in new], timeout=60)
    reader = run2.batches(2, timeout=3, group="run2")
    assert [g.rewards for g in reader.next_batch().groups] == [[0.0, 1.0]]  # run 1's group is not replayed
    reader.close()

    # A reader that queued nothing has no first enqueue to start at: it reads the stream from its start, and says so.
    looker = Producer.from_url(redis_server.url, namespace)
    with caplog.at_level("WARNING", logger="rollq.producer.batches"):
        every = looker.batches(2, timeout=3, group="audit")
        assert len(every.next_batch().groups) == 2
    every.close()
    assert "reads the 4 rollout(s) already in the results stream" in caplog.text
    latest = looker.batches(1, timeout=1, group="from-now", start="$")
    with pytest.raises(BatchTimeoutError):
        latest.next_batch()


def test_validation_rollouts_in_the_namespace_stay_out_of_training_batches(producer, serve) -> None:
    val = producer.enqueue_many([{"rewards": [0.5]}] * 2, mode="val")
    train = producer.enqueue_many([{"rewards": [1.0, 0.0]}] * 2, mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in val + train], timeout=60)
    reader = producer.batches(3, timeout=3)
    batch = reader.next_batch()
    assert [len(g.rollouts) for g in batch.groups] == [2, 2] and batch.partial  # no val rollout as a group of one
    assert {r.metadata["mode"] for r in batch.rollouts} == {"train"}
    reader.close()
    assert producer.connection.xpending(producer.keys.results, "batches")["pending"] == 0  # the val ones acknowledged
    (evaluated,) = producer.batches(1, timeout=3, group="evals", modes=["val"]).next_batch().groups[:1]
    assert evaluated.rollouts[0].metadata["mode"] == "val"


def test_async_producer_batches(redis_server, namespace, serve) -> None:
    async def main() -> list[list[float | None]]:
        producer = AsyncProducer.from_url(redis_server.url, namespace)
        await producer.enqueue_many([{"rewards": [0.0, 1.0]}] * 2, mode="train", group_size=2)
        got = []
        async for batch in producer.batches(2, timeout=60):
            got = [g.rewards for g in batch.groups]
            break
        await producer.aclose()
        return got

    serve()
    assert asyncio.run(main()) == [[0.0, 1.0], [0.0, 1.0]]


def test_status_metrics_and_dashboard_show_what_became_of_training_groups(producer, serve, redis_server) -> None:
    from rollq.ops.dashboard import create_app
    from rollq.ops.metrics import render_prometheus
    from rollq.ops.status import render_text

    redis_url = redis_server.url

    producer.enqueue_many([{"rewards": [1.0, 0.0], "fail": [0]}, {"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    wait_until(lambda: producer.connection.xlen(producer.keys.results) == 4, "4 rollouts", timeout=60)
    producer.batches(2, timeout=2).next_batch()
    text = render_text(snapshot(producer.connection, producer.keys))
    assert "training groups   delivered 1, stale-dropped 0, stale-requeued 0, failed-dropped 1" in text
    metrics = render_prometheus(snapshot(producer.connection, producer.keys))
    assert f'rollq_training_groups_total{{namespace="{producer.namespace}",outcome="failed-dropped"}} 1.0' in metrics
    app = create_app(redis_url, producer.namespace)
    charts = app.test_client().get("/rollq/api/charts").json
    assert charts["training_groups"] == {"delivered": 1, "stale-dropped": 0, "stale-requeued": 0, "failed-dropped": 1}
    page = app.test_client().get("/rollq/charts").get_data(as_text=True)
    assert "delivered 1 · stale-dropped 0 · stale-requeued 0 · failed-dropped 1" in page


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "2"])
def test_a_group_size_that_is_not_a_whole_number_of_one_or_more_is_refused_with_a_value_error(producer, size) -> None:
    with pytest.raises(ValueError, match="group_size must be a whole number of at least 1"):
        producer.enqueue_many([{"rewards": [1.0]}], mode="train", group_size=size)
    assert producer.pending() == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"eps": -1.0}, "eps must be a finite number of 0 or more"),
        ({"eps": float("nan")}, "eps must be a finite number of 0 or more"),
        ({"group_timeout": float("inf")}, "group_timeout must be a finite number of seconds"),
        ({"group_timeout": 0}, "group_timeout must be a finite number of seconds"),
    ],
)
def test_a_group_policy_with_a_meaningless_value_is_refused(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        GroupPolicy(**fields)


def test_back_pressure_queues_whole_groups_so_a_timeout_leaves_no_group_half_queued(producer) -> None:
    # max_pending=4 with groups of 3: chunks of 3 (one group each), never a chunk of 4 that splits a group.
    with pytest.raises(BackpressureTimeoutError) as refused:
        producer.enqueue_many([{"rewards": [1.0]}] * 2, mode="train", group_size=3, max_pending=4, pending_timeout=0.5)
    assert refused.value.queued == 3 and producer.pending() == 3
    queued = producer.query_tasks(limit=10).tasks
    assert len({t.rollout_id.rsplit(".", 1)[0] for t in queued}) == 1  # a member's id is its group's id + index


def test_back_pressure_below_one_group_is_refused_before_anything_is_queued(producer) -> None:
    with pytest.raises(ValueError, match="max_pending=2 is less than group_size=3"):
        producer.enqueue_many([{"rewards": [1.0]}], mode="train", group_size=3, max_pending=2)
    assert producer.pending() == 0


def test_pending_counts_a_task_a_worker_took_off_the_queue_and_has_not_claimed_yet(producer) -> None:
    # test_max_pending_holds_enqueue_until_rollouts_finish saw 5 pending under max_pending=4 in CI: a job a worker
    # had moved to RQ's intermediate list (BLMOVE) but not yet claimed was counted nowhere, so a chunk got in.
    producer.enqueue_many([{"rewards": [1.0]}] * 3, mode="train")
    producer.connection.lmove(producer.keys.rq_queue, producer.keys.rq_intermediate, "LEFT", "RIGHT")
    assert producer.pending() == 3


def test_cancelled_tasks_leave_pending_and_status_at_once_and_packs_count_as_their_tasks(producer) -> None:
    # A cancelled task's RQ job stays on the list until a worker drops it: it is no longer queued for back-pressure
    # or rollq status. A pack is one job on RQ's list for several queued tasks: status counts the tasks.
    tasks = producer.enqueue_many([{"rewards": [1.0]}] * 3, mode="train")
    producer.cancel([t.rollout_id for t in tasks])
    assert producer.pending() == 0
    assert snapshot(producer.connection, producer.keys).queued == 0
    producer.enqueue_many([{"rewards": [1.0]}] * 32, mode="train", tasks_per_job=16)
    assert producer.pending() == 32
    assert snapshot(producer.connection, producer.keys).queued == 32


def test_max_pending_holds_enqueue_until_rollouts_finish(producer, serve) -> None:
    first = producer.enqueue_many([{"rewards": [1.0], "sleep": 0.5}] * 4, mode="train", group_size=2)
    assert producer.pending() == 8
    with pytest.raises(BackpressureTimeoutError) as refused:
        producer.enqueue_many([{"rewards": [1.0]}], mode="train", group_size=2, max_pending=8, pending_timeout=0.5)
    assert refused.value.queued == 0 and producer.pending() == 8
    serve()
    after_each_chunk: list[int] = []
    started = time.monotonic()
    more = producer.enqueue_many(
        [{"rewards": [1.0]}] * 6,
        mode="train",
        group_size=2,
        max_pending=4,
        on_progress=lambda _: after_each_chunk.append(producer.pending()),
    )
    assert time.monotonic() - started > 0.5  # it waited for the first tasks to drain
    assert len(after_each_chunk) == 3 and max(after_each_chunk) <= 4
    producer.wait([t.rollout_id for t in first + more], timeout=60)


def test_a_second_trainer_reading_under_a_live_readers_name_is_refused_not_handed_its_groups(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}] * 3, mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    first = producer.batches(3, timeout=10)  # a trainer started with the defaults ...
    trained = {g.group_id for g in first.next_batch().groups}
    assert len(trained) == 3
    second = producer.batches(3, timeout=3, claim_timeout=1)  # ... and a second one, started the same way
    with pytest.raises(ReaderBusyError) as busy:
        second.next_batch()  # it was handed the first trainer's 3 groups, all trained on twice
    message = str(busy.value)
    assert "consumer 'batches-consumer' of group 'batches'" in message and "world_size" in message
    first.close()  # the first trainer ends: the name is free, and nothing is left to hand over
    with pytest.raises(BatchTimeoutError):
        second.next_batch()
    second.close()


def test_a_trainer_restarted_where_it_died_takes_its_name_over_at_once(producer, serve, redis_server) -> None:
    # The name's lease lapses 10 s after a trainer dies; one restarted on the same machine (same host, same PID
    # namespace) sees that the holder no longer runs and need not wait that out.
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    died = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_READER, redis_server.url, producer.namespace], stdout=subprocess.PIPE, text=True
    )
    assert died.stdout is not None and died.stdout.readline().strip() == "holding"
    died.kill()
    died.wait()
    key = producer.keys.batch_reader("batches", "batches-consumer")
    assert f"pid {died.pid} " in producer.connection.get(key).decode()  # its lease has 10 s to run
    started = time.monotonic()
    restarted = producer.batches(1, timeout=10, claim_timeout=1)  # would raise ReaderBusyError after 1 s
    assert len(restarted.next_batch().groups) == 1  # the group the dead trainer had been handed, not finished
    assert time.monotonic() - started < 5
    assert f"pid {os.getpid()} " in producer.connection.get(key).decode()
    restarted.close()


def test_a_name_held_by_a_live_process_or_by_another_machine_is_not_taken_over(producer) -> None:
    key = producer.keys.batch_reader("batches", "batches-consumer")
    namespace_inode = os.stat("/proc/self/ns/pid").st_ino
    for holder in (
        f"{socket.gethostname()} pid {os.getppid()} ns {namespace_inode} abcd1234",  # alive
        f"another-host pid 999999999 ns {namespace_inode} abcd1234",  # no such PID here, but another machine's
        f"{socket.gethostname()} pid 999999999 ns 1 abcd1234",  # another PID namespace (a container)
    ):
        producer.connection.set(key, holder, px=10_000)
        with pytest.raises(ReaderBusyError):
            producer.batches(1, timeout=1, claim_timeout=0.5).next_batch()
        assert producer.connection.get(key).decode() == holder


_HOLD_A_READER = """
import sys
from rollq.producer import Producer
producer = Producer.from_url(sys.argv[1], sys.argv[2])
reader = producer.batches(1, timeout=30)
reader.next_batch()  # handed the group, never finished with it: the trainer is killed
print("holding", flush=True)
import time
time.sleep(60)
"""


def test_a_late_duplicate_of_a_group_trained_on_before_a_restart_does_not_hand_the_group_over_again(
    producer, serve
) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0]}], mode="train", group_size=2)
    serve()
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    policy = GroupPolicy(group_timeout=1.0)
    before = producer.batches(1, timeout=10, policy=policy, consumer="trainer-0")
    (group,) = before.next_batch().groups
    before.close()  # trained on and acknowledged; then the trainer restarts
    stream = producer.keys.results
    _, fields = producer.connection.xrange(stream, count=1)[0]
    producer.connection.xadd(stream, fields)  # member 0 published again (a retried publish), read after the restart
    again = producer.batches(1, timeout=4, policy=policy, consumer="trainer-0")
    with pytest.raises(BatchTimeoutError):
        # The duplicate waited group_timeout for its group's other member, found it finished in the stream and
        # completed the group again: handed over a second time.
        print(again.next_batch().groups[0].group_id, group.group_id)
    again.close()
    assert again.assembler.duplicates == 1
    assert producer.connection.xpending(stream, "batches")["pending"] == 0


def test_a_group_begun_before_a_reader_started_at_the_streams_end_is_completed_from_the_stream(producer, serve) -> None:
    tasks = producer.enqueue_many([{"rewards": [1.0, 0.0], "sleep_member": 1}], mode="train", group_size=2)
    serve()
    producer.wait([tasks[0].rollout_id], timeout=60)
    reader = producer.batches(1, timeout=30, policy=GroupPolicy(group_timeout=1.0), group="late", start="$")
    (group,) = reader.next_batch().groups  # member 0 came before the reader's start: looked up, not a duplicate
    assert group.rewards == [1.0, 0.0]
    reader.close()


def test_a_stale_group_is_queued_again_with_its_own_rollout_policy(producer, serve) -> None:
    patient = RolloutPolicy(timeout_seconds=1800.0, max_attempts=5)  # a long agent's, not the producer's default
    producer.update_resources(RESOURCES)
    old = producer.enqueue_many([{"rewards": [0.25, 0.75]}], mode="train", group_size=2, policy=patient)
    serve()
    producer.wait([t.rollout_id for t in old], timeout=60)
    producer.update_resources(RESOURCES)
    reader = producer.batches(1, max_staleness=0, timeout=60, policy=GroupPolicy(on_stale="requeue"))
    (group,) = reader.next_batch().groups
    reader.close()
    again = group.rollouts[0].rollout_id
    # It was queued again under the producer's default policy: a 300 s timeout and 3 attempts.
    assert read_records(producer.connection, producer.keys, [again])[again].policy == patient
