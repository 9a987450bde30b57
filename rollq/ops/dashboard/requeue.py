"""rq-dashboard's Requeue buttons on rollq jobs: re-run the task, or refuse saying why.

RQ's own requeue puts the same job back on the queue; a rollq worker then finds the task already ended (failed),
skips the job, and RQ files it as *finished*: the button answered OK and nothing re-ran (issue 23). For a rollq
job this instead requeues the task through rollq (:meth:`~rollq.producer.Producer.requeue_dead`: a new job, a
fresh attempt budget, the next generation) when it is in the dead-letter set, and removes the old job from the
failed registry; for a task that is not dead-lettered it answers ``ERROR`` with a message naming its state.
Jobs that are not rollq's are requeued as rq-dashboard would.
"""

from __future__ import annotations

from typing import Any

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from rollq.models.errors import InvalidTaskError, RollqError
from rollq.producer import Producer
from rollq.store.jobs import rollout_ids_of
from rollq.store.records import read_records


def requeue(connection: redis.Redis, job_id: str) -> dict[str, Any]:
    """Requeue one failed job as the Requeue button should; the reply is rq-dashboard's JSON shape."""
    try:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:
        return {"status": "ERROR", "message": f"no job {job_id}"}
    try:
        rollout_ids = rollout_ids_of(job)
    except InvalidTaskError:  # not a rollq job: what rq-dashboard does
        job.requeue()
        return {"status": "OK"}
    try:
        producer = Producer(connection, job.origin)
    except (RollqError, ValueError) as exc:
        return {"status": "ERROR", "message": str(exc)}
    requeued = producer.requeue_dead(rollout_ids)
    if requeued:
        FailedJobRegistry(job.origin, connection=connection, serializer=JSONSerializer).remove(job, delete_job=True)
        named = requeued[0] if len(requeued) == 1 else f"{len(requeued)} tasks of the pack"
        return {"status": "OK", "message": f"task {named} queued again (rollq dead-letter requeue)"}
    records = read_records(connection, producer.keys, rollout_ids)
    states = ", ".join(
        f"{rid} is {records[rid].state.value if rid in records else 'gone (its record expired)'}" for rid in rollout_ids
    )
    return {
        "status": "ERROR",
        "message": f"task {states}, not in the dead-letter set: nothing to re-run "
        "(rollq requeues failed tasks itself; `rollq dead-letter requeue` re-runs dead-lettered ones)",
    }


def requeue_failed(connection: redis.Redis, queue_name: str) -> dict[str, Any]:
    """Requeue every job of ``queue_name``'s failed registry with :func:`requeue`."""
    queue = Queue(queue_name, connection=connection, serializer=JSONSerializer)
    replies = [requeue(connection, job_id) for job_id in queue.failed_job_registry.get_job_ids(cleanup=False)]
    refused = [r["message"] for r in replies if r["status"] != "OK"]
    return {"status": "OK" if not refused else "ERROR", "count": len(replies) - len(refused), "refused": refused}
